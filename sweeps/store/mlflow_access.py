"""Whether this driver may write to its MLflow experiment, checked before anything is created,
and what an experiment's artifact location means for a team.

A tracking server with authentication (``mlflow server --app-name basic-auth``) answers
401 (no or wrong credentials) or 403 (no EDIT permission on the experiment: creating runs,
logging metrics, tags and artifacts all need EDIT; READ is the server's usual default). A server
started with ``--allowed-hosts`` answers every API call with a 403 too when the request's Host
header is not allowed; its body (:data:`INVALID_HOST_MSG`) tells it apart, and the message names
the server's flag, not a permission.
Either is a configuration error: :func:`check_access` raises :class:`MlflowDenied` (the
driver exits 2) before the study or the parent run exist. So is a server that answers but
has no MLflow REST API there (MLflow's ``ENDPOINT_NOT_FOUND``, a JSON or HTML page that is not
MLflow's, a TLS handshake against a plain-HTTP port: a ``tracking.uri`` naming another
service or a wrong scheme, path or port), :class:`NotMlflow` (:func:`api_mismatch`); waiting
would never help. An unreachable server is not: the sweep goes on and syncs later
(:mod:`sweeps.store.tracking`).
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlsplit

from sweeps.errors import ConfigurationError

log = logging.getLogger("servesweep.tracking")

# MLflow HTTP client settings for a tracking server (env names from mlflow.environment_variables):
# its defaults retry 7 times with backoff factor 2 (minutes), which would stall a sweep in an outage
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
#: MLflow's error codes for HTTP 401 / 403 (mlflow.protos.databricks_pb2, get_error_code)
_DENIED = {"UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403}
KIND_TAG = ("mlflow.experimentKind", "custom_model_development")  # the tag the Tracker sets (a no-op rewrite)
#: the body of the 403 an ``mlflow server --allowed-hosts`` answers for a Host it does not allow
#: (mlflow.server.security_utils.INVALID_HOST_MSG, MLflow 3.x; text/plain)
INVALID_HOST_MSG = "Invalid Host header - possible DNS rebinding attack detected"


class MlflowDenied(ConfigurationError, RuntimeError):
    """MLflow refused this driver (401/403): names the experiment and the permission needed."""


class NotMlflow(MlflowDenied):
    """``tracking.uri`` answers, but not as MLflow's REST API (:func:`api_mismatch`)."""


def not_mlflow_message(uri: str, answer: str = "404 for /api/2.0/mlflow/...") -> str:
    """What to do when ``uri`` answers HTTP, but not as MLflow's REST API (``answer``: what it said)."""
    return (f"tracking.uri {uri} answers, but not as an MLflow tracking server ({answer}): it is another "
            f"service, or the URI has a wrong scheme, path or port. Fix: tracking.uri=http://<host>:<port> of an "
            f"`mlflow server` (check: curl <uri>/health answers OK). Nothing was started.")


def _client_settings() -> dict[str, Any]:
    """httpx keyword arguments (auth, headers, verify) from MLflow's own client settings
    (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``/``_TOKEN``/``_INSECURE_TLS``/``_SERVER_CERT_PATH``)."""
    env = os.environ.get
    out: dict[str, Any] = {"verify": False if env("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("1", "true")
                           else env("MLFLOW_TRACKING_SERVER_CERT_PATH") or True}
    if env("MLFLOW_TRACKING_USERNAME"):
        out["auth"] = (env("MLFLOW_TRACKING_USERNAME"), env("MLFLOW_TRACKING_PASSWORD") or "")
    elif env("MLFLOW_TRACKING_TOKEN"):
        out["headers"] = {"Authorization": f"Bearer {env('MLFLOW_TRACKING_TOKEN')}"}
    return out


def api_mismatch(uri: str, experiment: str, timeout_s: float = 15.0) -> str | None:
    """What ``uri`` answered instead of MLflow's REST API, or None when it answered as MLflow,
    refused credentials (401/403: the MLflow client says what to do) or did not answer at all
    (an outage). Asks what the client asks first: ``GET /api/2.0/mlflow/experiments/get-by-name``,
    whose MLflow answers are ``{"experiment": ...}`` (200) or a body with ``error_code``."""
    import ssl

    import httpx

    try:
        r = httpx.get(uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name",
                      params={"experiment_name": experiment}, timeout=timeout_s, **_client_settings())
    except httpx.ConnectError as e:
        c: BaseException | None = e
        while c is not None and not isinstance(c, ssl.SSLError):
            c = c.__cause__ or c.__context__
        return f"TLS handshake failed: {c}; is the scheme (http/https) right?" if c is not None else None
    except httpx.HTTPError:
        return None
    if r.status_code in (401, 403):
        return None
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and ("error_code" in body or (r.status_code == 200 and "experiment" in body)):
        return None
    kind = r.headers.get("content-type", "?").split(";")[0]
    return f"HTTP {r.status_code} {kind} for /api/2.0/mlflow/experiments/get-by-name: {r.text[:80]!r}"


def is_http(uri: str | None) -> bool:
    """True for a tracking server URI (``http://`` / ``https://``)."""
    return bool(uri) and str(uri).startswith(("http://", "https://"))


def denied_status(e: BaseException) -> int | None:
    """401 or 403 when ``e`` (an MLflow client error) is an authentication/permission refusal, else None."""
    code = getattr(e, "error_code", None)
    if code in _DENIED:
        return _DENIED[code]
    text = str(e)
    return next((s for s in (401, 403) if f"error code {s} " in text), None)


def host_refused(text: str) -> bool:
    """True when a 403's body (or an MLflow client error quoting it) is the server refusing the
    request's Host header (``mlflow server --allowed-hosts``), not a permission check."""
    return INVALID_HOST_MSG.lower() in text.lower()


def host_refused_message(uri: str) -> str:
    """What to do when the server at ``uri`` refuses the Host header this driver sends."""
    host = urlsplit(uri).netloc.rsplit("@", 1)[-1] or uri
    return (f"MLflow at {uri} refused the Host header {host!r} (403 {INVALID_HOST_MSG!r}): the server's "
            f"--allowed-hosts (or MLFLOW_SERVER_ALLOWED_HOSTS) does not list the name this driver reaches it by. "
            f"This is not a permission problem: no EDIT grant helps. Fix: restart the server with that name "
            f"allowed (mlflow server --allowed-hosts {host},<the names it already allows>), or set tracking.uri to a "
            f"host name the server allows. Nothing was started.")


def denied_message(status: int, uri: str, experiment: str, body: str = "") -> str:
    """What to do about a 401/403 from the server at ``uri`` for ``experiment``; ``body`` (the
    response body, or the client error quoting it) tells a Host-header refusal (:func:`host_refused`)
    from a permission refusal."""
    if status == 403 and host_refused(body):
        return host_refused_message(uri)
    who = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if status == 401:
        return (f"MLflow at {uri} rejected this driver's credentials (401) for experiment {experiment!r} "
                f"(MLFLOW_TRACKING_USERNAME={who or 'unset'}): set MLFLOW_TRACKING_USERNAME and "
                f"MLFLOW_TRACKING_PASSWORD to a user with EDIT permission on the experiment. Nothing was started.")
    return (f"MLflow at {uri} denied user {who or '?'} EDIT permission on experiment {experiment!r} (403): a sweep "
            f"creates runs and logs metrics and artifacts, which needs EDIT. Ask the experiment's owner or an admin "
            f"to grant EDIT (POST /api/2.0/mlflow/experiments/permissions/create with permission=EDIT), use a user "
            f"that has it, or run under another sweep.name (a new experiment: its creator gets MANAGE). "
            f"Nothing was started.")


def check_access(uri: str, experiment: str) -> None:
    """Before anything is created: may this driver write to ``experiment`` on the server at ``uri``?

    Reads the experiment and rewrites the tag the :class:`~sweeps.store.tracking.Tracker` sets on
    it (same value: changes nothing), which needs EDIT. A missing experiment is not probed
    (its creator gets MANAGE on it). Local stores (SQLite, files) have no permissions.

    Raises:
        MlflowDenied: 401 or 403.
        NotMlflow: the server has no MLflow REST API. An outage is only logged (the sweep syncs later).
    """
    if not is_http(uri):
        return
    for k, v in HTTP_ENV.items():
        os.environ.setdefault(k, v)
    mismatch = api_mismatch(uri, experiment)
    if mismatch is not None:
        raise NotMlflow(not_mlflow_message(uri, mismatch))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        exp = client.get_experiment_by_name(experiment)
        if exp is not None and exp.lifecycle_stage == "active":
            client.set_experiment_tag(exp.experiment_id, *KIND_TAG)
    except Exception as e:  # noqa: BLE001 - MLflow raises MlflowException / requests errors
        status = denied_status(e)
        if status is not None:
            raise MlflowDenied(denied_message(status, uri, experiment, str(e))) from None
        log.warning("MLflow at %s unreachable (%s); the sweep goes on and syncs later", uri, str(e).splitlines()[0][:200])


def warn_local_artifacts(exp: Any, uri: str) -> bool:
    """Warn when an existing experiment under a tracking server stores artifacts on a local
    path (``file:`` or a bare path: a disk of the machine that created it), which the other
    machines of a team cannot read. MLflow never changes an experiment's artifact location.

    Returns:
        True when it warned.
    """
    loc = str(getattr(exp, "artifact_location", "") or "")
    if not is_http(uri) or not (loc.startswith("file:") or loc.startswith("/")):
        return False
    log.warning("experiment %r keeps its artifacts at %s, a path on the machine that created it, although MLflow is "
                "the server %s: other machines cannot read the trials' logs, findings and plots. MLflow never changes "
                "an experiment's artifact location. Fix: run under a new sweep.name=<name> (a new experiment, whose "
                "artifacts go through the server: mlflow-artifacts:/<name>), or rename this experiment in MLflow so "
                "the next run creates it anew.", exp.name, loc, uri)
    return True
