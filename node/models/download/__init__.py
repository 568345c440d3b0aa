"""Model downloads: a GGUF from a URL (or hf://owner/repo/file.gguf) into the data dir's models/.

urls.py (what is accepted, how it is shown), job.py (DownloadJob), partfile.py (the resumable
.part file), fetch.py (one HTTP attempt), runner.py (ModelDownloader: jobs, retries, verification).
"""

from .job import DownloadJob
from .runner import ModelDownloader
from .urls import display_url, file_name_for, resolve_url

__all__ = ["DownloadJob", "ModelDownloader", "display_url", "file_name_for", "resolve_url"]
