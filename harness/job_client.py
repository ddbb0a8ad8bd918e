"""Ray's job client with a bound on every request: a job server that stops answering (its Ray
killed, frozen or cut off) ends a call within `REQUEST_TIMEOUT_S` instead of never."""

from __future__ import annotations

from typing import Any

import requests
from ray.job_submission import JobSubmissionClient

REQUEST_TIMEOUT_S = 15.0


class TimedJobClient(JobSubmissionClient):
    """`JobSubmissionClient` whose HTTP requests (submit, status, info, stop, and the version
    check of its constructor) time out; Ray's own passes no timeout to ``requests``."""

    def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
        return super()._do_request(method, endpoint, **kwargs)
