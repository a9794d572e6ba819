"""The golden vectors the tests read, and the script that makes them (README.md)."""
