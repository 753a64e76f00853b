"""Command-line entry points (not tests), thin over the bench package: each prints a table and
writes JSON under outputs/bench/<date>/<script>/ unless --out names another place (docs/results/)."""
