from dcpcheck.cli import main

main()
