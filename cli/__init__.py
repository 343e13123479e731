"""What every command line shares (train, sweep, rerun, report, claims, bench): the `@command` wrapper of
a command's main (cli.entry), the exit codes and the errors that end a command with one (cli.exit_codes),
and how much a command prints (cli.console). The bottom layer: it imports no other package of the project,
so that each package can define the errors its commands report."""
