"""One module per ``kvdoctor`` subcommand (see kvdoctor/cli.py for the contract)."""
