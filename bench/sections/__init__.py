"""One module per section of `make bench`, each with `measure(bench)`: it fills
`bench.results` and stops what it started."""
