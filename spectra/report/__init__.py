"""Reporting: turn finished runs into what people read — summary numbers, the nonuniform k plan, terminal
tables and figures.

Everything here reads run objects (`spectra.runs.Run`, `ApproxRun`, `TheoremRun`) or run directories, never
models, so it needs neither torch nor a GPU (the method registry is imported, lazily, only for its colours and
headers). Dependencies point one way:

- `summaries`: the numbers shown both in the terminal and in figures (pure numpy/pandas);
- `plan`: the nonuniform projected dimension (the k plan), built on a run's curves;
- `console`: progress bar and tables, printing the two above;
- `plots`: figures (`plots.style` holds what every figure shares), drawing the numbers of `summaries`.
"""
