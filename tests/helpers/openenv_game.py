"""A tiny text game written with openenv-core's server API, and a server of it in a subprocess
(for tests/test_openenv.py and docs/environments.md's OpenEnv section).

    python tests/helpers/openenv_game.py --port 8000 --sessions 64     # serve it
    with GameServer(sessions=8) as server:                              # in a test
        client = OpenEnvClient(server.url, observation_field="text")

HiLo: reset(seed) hides a number from 1 to 9 (random.Random(seed)) and gives 3 guesses. An
action is a message (at most 32 characters: a longer one is refused by the action's schema);
"5" scores 1.0 and ends the episode when right, else "Higher." / "Lower." and 0.0; a message
that is not a number costs a guess and scores -0.1. The observation: `text`, `guesses_left`,
`solved`.

The server's test hooks (flags): --log PATH (a JSON line at the start, and per reset and step:
its kind, seed or message, and the session, an id of its env instance), --slow S (the message
"wait" takes S seconds), --die-after R (the process exits, as if killed, at the first message
after R resets were answered) and --broken nonjson|nofields (a server whose /ws answers
garbage, its /health and /schema real).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    message: str = Field(..., max_length=32, description="A number from 1 to 9.")


class GuessObservation(Observation):
    text: str = Field(default="", description="What the game says.")
    guesses_left: int = Field(default=3)
    solved: bool = Field(default=False)


class GuessState(State):
    target: int = 0
    guesses_left: int = 3


SLOW = 0.0  # seconds the message "wait" takes (--slow)
DIE_AFTER = 0  # exit at the first message after this many resets (--die-after; 0: never)
LOG = ""  # the messages' log (--log)
_resets = 0
_lock = threading.Lock()


def _arrived(env: "HiLo", **entry) -> None:
    """Dies if told to (--die-after), logs the message (--log)."""
    global _resets
    with _lock:
        if DIE_AFTER and _resets >= DIE_AFTER:
            os._exit(1)
        _resets += entry["kind"] == "reset"
        if LOG:
            with open(LOG, "a") as log:
                log.write(json.dumps({**entry, "session": id(env)}) + "\n")


def read_log(path) -> list[dict]:
    """The entries of a server's --log file (none before its first message)."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class HiLo(Environment):
    """The game (see the module docstring); one instance per WebSocket session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = GuessState()

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        _arrived(self, kind="reset", seed=seed)
        target = random.Random(seed).randint(1, 9)
        self._state = GuessState(episode_id=episode_id, target=target, guesses_left=3)
        return GuessObservation(text="Guess a number from 1 to 9. You have 3 guesses.",
                                guesses_left=3)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        _arrived(self, kind="step", message=action.message)
        s = self._state
        message = action.message.strip()
        if message == "wait":
            time.sleep(SLOW)
        s.step_count += 1
        s.guesses_left -= 1
        if not message.isdigit():
            text, reward = f"{message!r} is not a number from 1 to 9.", -0.1
        elif int(message) == s.target:
            return GuessObservation(text="Right!", guesses_left=s.guesses_left, solved=True,
                                    done=True, reward=1.0)
        else:
            text = "Higher." if int(message) < s.target else "Lower."
            reward = 0.0
        done = s.guesses_left == 0
        if done:
            text += f" No guesses left; it was {s.target}."
        return GuessObservation(text=text, guesses_left=s.guesses_left, done=done, reward=reward)

    @property
    def state(self) -> GuessState:
        return self._state


def broken_app(kind: str):
    """A server whose /health, /schema and /metadata are the game's and whose /ws answers every
    message with garbage: `kind` "nonjson" (an HTML page) or "nofields" (JSON without the
    observation)."""
    app = FastAPI()
    schema = {"action": GuessAction.model_json_schema(),
              "observation": GuessObservation.model_json_schema(),
              "state": GuessState.model_json_schema()}
    app.get("/health")(lambda: {"status": "healthy"})
    app.get("/schema")(lambda: schema)
    app.get("/metadata")(lambda: {"name": "HiLo", "description": "broken"})

    @app.websocket("/ws")
    async def ws(websocket: WebSocket):
        await websocket.accept()
        try:
            while True:
                await websocket.receive_text()
                await websocket.send_text(
                    "<html>502 Bad Gateway</html>" if kind == "nonjson"
                    else json.dumps({"type": "observation", "data": {"reward": 0.0}}))
        except WebSocketDisconnect:
            pass

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GameServer:
    """The game served by this file in a subprocess on 127.0.0.1 (a free port unless given);
    `start()` waits for /health. A context manager (killed at the end)."""

    def __init__(self, port: int | None = None, *flags: str, sessions: int = 16):
        self.port = port or free_port()
        self.flags = ("--sessions", str(sessions), *flags)
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, *flags: str, timeout: float = 120) -> GameServer:
        """Starts the server (these flags instead of the constructor's, if given)."""
        self.stderr = tempfile.TemporaryFile("w+")  # not a pipe: a full one would block it
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__)), "--port", str(self.port),
             *(flags or self.flags)], stdout=subprocess.DEVNULL, stderr=self.stderr)
        deadline = time.monotonic() + timeout
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stderr.seek(0)
                raise RuntimeError(f"the game server exited: {self.stderr.read()}")
            try:
                with direct.open(self.url + "/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"the game server at {self.url} did not answer /health in {timeout} s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()
            self.stderr.close()

    def __enter__(self) -> GameServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()


def main() -> None:
    global SLOW, DIE_AFTER, LOG
    parser = argparse.ArgumentParser(description="Serves the HiLo guessing game (OpenEnv).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sessions", type=int, default=64,
                        help="max concurrent WebSocket sessions (one per rollout row)")
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--broken", choices=("nonjson", "nofields"))
    parser.add_argument("--log", default="")
    args = parser.parse_args()
    SLOW, DIE_AFTER, LOG = args.slow, args.die_after, args.log
    if LOG:
        with open(LOG, "a") as log:
            log.write(json.dumps({"kind": "start"}) + "\n")
    import uvicorn

    app = broken_app(args.broken) if args.broken else create_app(
        HiLo, GuessAction, GuessObservation, max_concurrent_envs=args.sessions)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
