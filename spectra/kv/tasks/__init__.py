"""Long-context tasks for `spectra cache`: task records (kvpress's and RULER's formats), RULER's scores, and the
offline generator of RULER's synthetic tasks, passkey and kv_retrieval (`spectra tasks`). Torch-free at import."""

from .records import TaskRecord, is_task_file, read_records
from .scoring import score

__all__ = ["TaskRecord", "is_task_file", "read_records", "score"]
