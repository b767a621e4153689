"""The Linformer paper's theory: its bounds (bounds.py) and the errors they bound, on single batches (kernels.py)."""
