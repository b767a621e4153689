"""Probes: streaming reducers fed one `Captured` layer at a time, whose states checkpoint, resume and combine.

Every analysis is a choice of probes run by the one loop (`spectra.loop`). A probe overrides what it
needs of the protocol below; the rest are no-ops:

- `update(captured)`: one layer of one forward pass;
- `after_batch(batch)`: once the batch's forward pass is done (end to end runs its own forward passes here);
- `state()` → `State` (array name → array and how it reduces across processes) and `load_state(arrays)`;
  `ready()` says whether the state may be checkpointed now;
- `tables()` → {file name: tidy DataFrame}, `arrays()` → {file name: {name: array}} (written as .npz);
- `describe()` → facts for run.json; `close()` → release threads and the like.

`Probes` runs several under one name each, namespacing their states.
"""

from .base import Probe, Probes

__all__ = ["Probe", "Probes"]
