from dcpcheck.cli import command_line

command_line()
