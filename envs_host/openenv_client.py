"""OpenEnv environments as host envs: the env runs as a server, the trainer is its client.

    config.env.name = "openenv:http://127.0.0.1:8000"        # or envs_host.make(that name)
    config.env.kwargs = {"action_field": "message", "observation_field": "text"}
    OpenEnvClient("http://127.0.0.1:8000", action_field="message")     # the same, in Python

The wire protocol is openenv-core 0.3's server's (openenv.core.env_server.http_server), spoken
with `websockets` and the standard library: GET /health and /schema when an instance is built
(/metadata for the instructions if none are given), then a WebSocket session on /ws per
episode, {"type": "reset" | "step", "data": ...} answered {"type": "observation", "data":
{"observation", "reward", "done"}} or {"type": "error", ...}. The server builds one env per
WebSocket session (its HTTP /reset and /step build one per request, so an episode cannot span
them): each instance, one per rollout row, plays its own session, released when the episode
ends or the rollout does (`end_episode`). The server must allow a rollout's rows as sessions
(OpenEnv's `max_concurrent_envs`, 1 by default).

The mapping (envs_host.base's protocol): the action's text goes into the action field
`action_field` (other fields from `action_defaults`); the text shown is the observation's
field `observation_field`, `observation_format` filled with its fields, or a callable of it
(default: its one string field, else every field a "name: value" line); reward (None: 0.0)
and done are the server's; info["success"] is the boolean observation field `success_field`,
or done and reward >= `success_reward` (OpenEnv 0.3 does not send an observation's metadata).
An action the action's schema refuses is an invalid action: reward 0, nothing changes.

Faults. A lost or refused connection (a server restarting, all its sessions in use) is
retried with backoff for up to `retry_seconds`, the episode replayed on a new session (reset
with its seed, then every action so far, each answer checked against the recorded one) and
the call made again. HostEnvError (the run stops: envs_host.pool re-raises it, run.py prints
one line): still unreachable after `retry_seconds` (also when an instance is built: a server
that is down stops a run before training), an answer that is not OpenEnv's, a field in the
kwargs that the server's schemas lack. OpenEnvError (the row fails: reward 0, counted in
host/failed_rows): no answer within `timeout`, the server's env raised, a replay that gave
other answers (an env that is not deterministic).
"""

from __future__ import annotations

import json
import string
import time
from typing import Any, Callable

from envs_host.base import EnvSettings, HostEnv, HostEnvError
from envs_host.registry import register_namespace

_SKIPPED = ("done", "reward", "metadata")  # Observation's fields that are not its content


class OpenEnvError(RuntimeError):
    """A call that fails its row (the run goes on): see the module docstring."""


class _Lost(Exception):
    """A connection lost or refused (retried; the message says how)."""


class OpenEnvClient(HostEnv):
    """One episode at a time of the OpenEnv server at `url` (see the module docstring).

    timeout: seconds to wait for one answer. retry_seconds: how long a lost server is retried
    (keep timeout + retry_seconds below host.timeout, the pool's limit of one call). The
    HostEnv attributes `instructions` (default: the server's /metadata description),
    `action_names` (default None: free text) and `observation_tokens` are keyword arguments.
    """

    settings = EnvSettings(max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)

    def __init__(self, url: str, *, action_field: str = "message",
                 observation_field: str | Callable[[dict], str] | None = None,
                 observation_format: str | None = None, success_field: str | None = None,
                 success_reward: float = 1.0, action_defaults: dict | None = None,
                 instructions: str | None = None, action_names: tuple[str, ...] | None = None,
                 observation_tokens: int = 256, timeout: float = 20.0,
                 retry_seconds: float = 30.0):
        try:
            from websockets.sync.client import connect
        except ImportError as error:
            raise ImportError('OpenEnv servers need websockets: pip install '
                              '"starpo-jax[openenv]"') from error
        self._connect = connect
        url = url.rstrip("/") if "://" in url else "http://" + url.rstrip("/")
        scheme, rest = url.split("://", 1)
        self.url = {"ws": "http", "wss": "https"}.get(scheme, scheme) + "://" + rest
        self._ws_url = {"http": "ws", "https": "wss"}.get(scheme, scheme) + "://" + rest + "/ws"
        host = rest.split("/")[0].rsplit(":", 1)[0].strip("[]")
        self._local = host in ("localhost", "127.0.0.1", "::1")  # never through a proxy
        self.action_field, self.success_field = action_field, success_field
        self.success_reward, self.action_defaults = float(success_reward), action_defaults or {}
        self.observation_field, self.observation_format = observation_field, observation_format
        self.timeout, self.retry_seconds = float(timeout), float(retry_seconds)
        self.action_names, self.observation_tokens = action_names, observation_tokens
        self._ws: Any = None
        self._seed, self._first, self._history, self._done = 0, None, [], True
        self._retrying("connecting", lambda: self._get("/health"))
        self._check_schema(self._get("/schema"))
        self.instructions = instructions if instructions is not None else \
            str(self._get("/metadata").get("description", ""))

    # ------------------------------------------------------------------ HostEnv
    def reset(self, seed: int) -> str:
        """A new session and episode `seed`; its observation's text."""
        self.end_episode()  # the previous episode's session, if it did not end
        self._seed, self._first, self._history, self._done = int(seed), None, [], False
        self._first = self._retrying("reset", self._replay)
        return self._text(self._first)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """`action` in the action field -> (text, reward, done, info); see the module
        docstring for the mapping and the retries."""
        if self._done:
            raise OpenEnvError(f"OpenEnv server {self.url}: step after the episode ended")
        payload = {**self.action_defaults, self.action_field: action}

        def attempt():
            if self._ws is None:
                self._replay()
            return self._exchange("step", payload)

        data = self._retrying("step", attempt)
        if data is None:  # refused by the action's schema: an invalid action
            last = self._history[-1][1] if self._history else self._first
            return self._text(last), 0.0, False, {"success": False, "action_is_valid": False,
                                                  "action_is_effective": False}
        self._history.append((payload, data))
        reward, done = float(data["reward"] or 0.0), bool(data["done"])
        if done:
            self._done = True
            self.end_episode()  # frees the server's session now
        success = bool(data["observation"].get(self.success_field)) if self.success_field \
            else done and reward >= self.success_reward
        return self._text(data), reward, done, {"success": success,
                                                "observation": data["observation"]}

    def state(self) -> dict[str, Any]:
        """The server's State of this episode's session (its episode_id, step_count, ...)."""
        if self._ws is None:
            raise OpenEnvError(f"OpenEnv server {self.url}: no episode is running")
        return self._exchange("state", None)

    def end_episode(self) -> None:
        """Closes the session (envs_host.pool calls it after each rollout); never raises."""
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.send(json.dumps({"type": "close"}))
                ws.close()
            except Exception:  # noqa: BLE001  (the session is being given up anyway)
                pass

    close = end_episode

    # ------------------------------------------------------------------ wire
    def _get(self, path: str) -> dict:
        import http.client
        import urllib.request  # here: the package is imported before JAX, and often unused

        handlers = [urllib.request.ProxyHandler({})] if self._local else []
        try:
            with urllib.request.build_opener(*handlers).open(self.url + path,
                                                             timeout=self.timeout) as answer:
                body = answer.read()
        except urllib.request.HTTPError as error:
            if error.code >= 500:  # e.g. a proxy in front of a server that is restarting
                raise _Lost(f"GET {path}: HTTP {error.code}") from None
            raise HostEnvError(f"OpenEnv server {self.url}: GET {path} answered HTTP "
                               f"{error.code}; is it an OpenEnv server?") from None
        except (OSError, TimeoutError) as error:
            raise _Lost(getattr(error, "reason", None) or error) from None
        except http.client.HTTPException as error:
            raise HostEnvError(f"OpenEnv server {self.url}: GET {path} got no HTTP answer "
                               f"({type(error).__name__}); is it an OpenEnv server?") from None
        return self._json(body, f"GET {path}")

    def _json(self, raw: Any, what: str) -> dict:
        try:
            value = json.loads(raw)
        except (TypeError, ValueError):
            value = None
        if not isinstance(value, dict):
            raise HostEnvError(f"OpenEnv server {self.url} answered {what} with {raw!r:.100}, "
                               "not a JSON object; is it an OpenEnv server?")
        return value

    def _retrying(self, what: str, attempt: Callable[[], Any]) -> Any:
        """attempt() until it returns, lost connections retried with backoff for
        retry_seconds, then HostEnvError."""
        start, delay = time.monotonic(), 0.1
        while True:
            try:
                return attempt()
            except _Lost as lost:
                self.end_episode()
                waited = time.monotonic() - start
                if waited >= self.retry_seconds:
                    raise HostEnvError(
                        f"OpenEnv server {self.url} unreachable while {what} ({lost}), retried "
                        f"for {waited:.0f} s (retry_seconds = {self.retry_seconds:g}); start it, "
                        "or correct the URL in env.name, then run again (--resume)") from None
                time.sleep(min(delay, self.retry_seconds - waited))
                delay = min(2 * delay, 2.0)

    def _replay(self) -> dict:
        """A new session with this episode replayed (reset, then every action so far), each
        answer checked against the recorded one; the reset's answer."""
        from websockets.exceptions import InvalidStatus

        try:
            # __enter__: the connection itself (websockets >= 17 warns when connect() is not
            # used as a context manager; the session outlives this call).
            self._ws = self._connect(self._ws_url, open_timeout=self.timeout, close_timeout=1,
                                     max_size=2 ** 26, **({"proxy": None} if self._local
                                                          else {})).__enter__()
        except InvalidStatus as error:
            if error.response.status_code >= 500:
                raise _Lost(f"/ws: HTTP {error.response.status_code}") from None
            raise HostEnvError(f"OpenEnv server {self.url}: /ws answered HTTP "
                               f"{error.response.status_code}; is it an OpenEnv server?") from None
        except Exception as error:  # noqa: BLE001  (refused, reset, a handshake cut short)
            raise _Lost(f"{type(error).__name__}: {error}") from None
        first = self._exchange("reset", {"seed": self._seed})
        if self._first is None:
            return first
        for payload, recorded in [(None, self._first), *self._history]:
            if (first if payload is None else self._exchange("step", payload)) != recorded:
                raise OpenEnvError(f"OpenEnv server {self.url}: replaying episode (seed "
                                   f"{self._seed}) after a lost connection gave other answers;"
                                   " the env is not deterministic")
        return first

    def _exchange(self, kind: str, data: Any) -> Any:
        """Sends one message, returns its answer's data (None: a step the schema refused)."""
        from websockets.exceptions import ConnectionClosed

        message = {"type": kind} if data is None else {"type": kind, "data": data}
        try:
            try:
                self._ws.send(json.dumps(message))
            except ConnectionClosed:
                raw = self._ws.recv(timeout=1)  # the server's last word (capacity), if any
            else:
                raw = self._ws.recv(timeout=self.timeout)
        except TimeoutError:
            self.end_episode()
            raise OpenEnvError(f"OpenEnv server {self.url}: no answer to {kind} within timeout "
                               f"= {self.timeout:g} s") from None
        except (ConnectionClosed, OSError) as error:
            raise _Lost(f"connection lost: {error}") from None
        answer = self._json(raw, kind)
        body = answer.get("data")
        if answer.get("type") == "error" and isinstance(body, dict):
            return self._error(kind, body)
        expected = "state" if kind == "state" else "observation"
        if answer.get("type") != expected or not isinstance(body, dict):
            raise HostEnvError(f"OpenEnv server {self.url} answered {kind} with type "
                               f"{answer.get('type')!r} and data {body!r:.100}; expected "
                               f"{expected!r} and a data object")
        if kind != "state" and not (
                isinstance(body.get("observation"), dict) and isinstance(body.get("done"), bool)
                and (body.get("reward") is None or isinstance(body["reward"], (int, float)))):
            raise HostEnvError(f"OpenEnv server {self.url} answered {kind} with data "
                               f"{body!r:.160}; expected an 'observation' object, a boolean "
                               "'done' and a number or null 'reward'")
        return body

    def _error(self, kind: str, body: dict) -> None:
        code, text = body.get("code"), " ".join(str(body.get("message", "")).split())[:300]
        if code == "CAPACITY_REACHED":
            self.end_episode()
            raise _Lost(f"all {body.get('max_sessions')} sessions of the server in use: serve "
                        "it with max_concurrent_envs >= the rollout's rows")
        if code == "VALIDATION_ERROR" and kind == "step":
            return None
        if code in ("EXECUTION_ERROR", "FACTORY_ERROR", "SESSION_ERROR"):
            self.end_episode()
            raise OpenEnvError(f"OpenEnv server {self.url}: {kind} failed there ({code}: {text})")
        raise HostEnvError(f"OpenEnv server {self.url} refused {kind} ({code}: {text})")

    # ------------------------------------------------------------------ mapping
    def _check_schema(self, schema: dict) -> None:
        """The kwargs' fields against the server's schemas (HostEnvError naming the valid
        ones); the default text field chosen."""
        def fields(name: str) -> dict:
            value = schema.get(name)
            props = value.get("properties") if isinstance(value, dict) else None
            if not isinstance(props, dict):
                raise HostEnvError(f"OpenEnv server {self.url}: GET /schema has no {name} "
                                   "schema with properties; is it an OpenEnv server?")
            return {k: v for k, v in props.items() if k not in _SKIPPED}

        actions, observations = fields("action"), fields("observation")
        named = [("action_field", self.action_field, actions)]
        named += [(k, v, observations) for k, v in (
            ("observation_field", self.observation_field), ("success_field", self.success_field))
            if isinstance(v, str)]
        if self.observation_format is not None:
            named += [("observation_format", f.split(".")[0].split("[")[0], observations)
                      for _, f, _, _ in string.Formatter().parse(self.observation_format) if f]
        named += [("action_defaults", k, actions) for k in self.action_defaults]
        for key, value, valid in named:
            if value not in valid:
                raise HostEnvError(f"env.kwargs {key} names {value!r}, which the OpenEnv server"
                                   f" {self.url} lacks; valid: {sorted(valid)}")
        if self.observation_field is None and self.observation_format is None:
            strings = [k for k, v in observations.items() if v.get("type") == "string"]
            self.observation_field = strings[0] if len(strings) == 1 else None
        self._fields = list(observations)

    def _text(self, data: dict) -> str:
        """The observation's text (see the module docstring)."""
        obs = data["observation"]
        field = self.observation_field
        try:
            if callable(field):
                value = field(obs)
            elif self.observation_format is not None:
                value = self.observation_format.format_map(obs)
            elif field is not None:
                value = obs[field]
            else:
                return "\n".join(f"{k}: {_plain(obs[k])}" for k in self._fields if k in obs)
        except KeyError as missing:
            raise HostEnvError(f"OpenEnv server {self.url} sent an observation without field "
                               f"{missing}: {obs!r:.160}") from None
        return _plain(value)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


register_namespace("openenv", OpenEnvClient, "url")
