"""Neural-network modules built from the paper: the Linformer layer and its projections."""
