"""WebShop (Yao et al. 2022) through its text environment's interface, as the original uses it.

    env = WebShopEnv()                       # webshop_minimal.WebAgentTextEnv, text mode
    obs = env.reset(7)                       # instruction page + the available actions
    obs, reward, done, info = env.step("search[red cotton shirt]")
    ... env.step("click[b07xyz1234]"), env.step("click[large]"), env.step("click[buy now]")

The wrapped object speaks WebShop's text env interface: `reset(session=goal_index)`,
`step(action) -> (observation, reward, done, info)`, `get_available_actions() ->
{"has_search_bar": bool, "clickables": [...]}`, `observation`, and `server.goals`. As the
original (ragen/env/webshop): an action is `search[keywords]` (valid while the page has a
search bar) or `click[clickable]` (valid if the page lists it); the reward is given at
"buy now", 1.0 when WebShop's score reaches 1 and 0 otherwise (info["raw_reward"] keeps the
score); success = reward 1. Every observation is the page text, the original's shopping hints
and "You must choose from these actions: ...". Seeds pick goals as the original does (train:
goals 1500 onwards, val: 500-1499, test: 0-499, through a fixed permutation); a catalogue with
fewer than 2000 goals uses all of them for every split.

The real data (products and goals) is not on this machine: this adapter is tested against a
small catalogue written for the tests that follows WebShop's page structure
(tests/webshop_catalogue.py), not against the real WebShop.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from envs_host.base import EnvSettings, HostEnv
from envs_host.registry import register

# The original's per-observation hints (its prompt wording).
HINTS = (
    "We must buy a product within 10 actions. It doesn't have to match perfectly with "
    "description.",
    "Search term should not include details like size, color.",
    "Never search for more than 2 times.",
    "Do not be too strict about the description, it's more important to buy one that is close "
    "enough within action limit.",
    "Prioritize click a product in the current page over going to next page.",
    "Almost never click[next >] for more than 2 times.",
    "Almost never click[< prev] unless you are sure the product is on one of the previous pages.",
    "If you have less than 3 actions left, just buy the first product you see in the current "
    "page.",
    "If an matching option exists, make sure to click[size] then click[color], one at a time, "
    "before click[buy now], but don't have to if only 1 action left, in that case you just "
    "click[buy now]. Never click description.",
)
_SPLITS = ("train", "val", "test")
_ACTION = re.compile(r"^\s*(\w+)\s*\[(.*)\]\s*$", re.DOTALL)


def parse_action(text: str) -> tuple[str, str | None]:
    """"click[Buy Now]" -> ("click", "buy now"); text without brackets -> (text, None)."""
    match = _ACTION.match(text)
    if match is None:
        return text.strip().lower(), None
    return match.group(1).lower(), match.group(2).strip().lower()


def _webshop_minimal(dataset: str, **kwargs: Any) -> Any:
    try:
        from webshop_minimal import WebAgentTextEnv, init_basedir
    except ImportError as error:
        raise ImportError(
            "the webshop env needs WebShop's text environment and its product data: install "
            "webshop_minimal (the original's fork of WebShop) and its data, or pass "
            "text_env_factory= an object with WebShop's text env interface") from error
    init_basedir(dataset)
    return WebAgentTextEnv(observation_mode="text", **kwargs)


class WebShopEnv(HostEnv):
    """WebShop as a host env (see the module docstring)."""

    instructions = (
        "You are browsing an online shop. Based on the instruction, buy a product that close to "
        "the production description. You need to search, read the search results, pick a "
        "product, choose the size and color and buy. You should only choose action from the "
        "available actions list provided later.  Example process: I need a gingko light and "
        "20x20 pillow cover that is hand painted. First search[gingko light 20x20 pillow cover "
        "hand painted], answer format: <answer>search[blanket with fleece throw]</answer>. "
        "Valid answer is search[<keywords>] or click[<clickable>].")
    observation_tokens = 1024
    settings = EnvSettings(max_turns=9, max_actions_per_turn=1, max_actions_per_traj=9)

    def __init__(self, text_env_factory: Callable[[], Any] | None = None, *,
                 split: str = "train", dataset: str = "small", **webshop_kwargs: Any):
        if split not in _SPLITS:
            raise ValueError(f"split {split!r} is invalid; valid: {_SPLITS}")
        self.split = split
        self.env = text_env_factory() if text_env_factory is not None \
            else _webshop_minimal(dataset, **webshop_kwargs)
        goals = len(self.env.server.goals)
        self._order = list(range(goals))
        random.Random(42).shuffle(self._order)  # the original's fixed permutation

    def goal_index(self, seed: int) -> int:
        """The goal a seed plays (the original's split ranges on the full goal set)."""
        n = len(self._order)
        if n < 2000:
            index = seed % n
        elif self.split == "test":
            index = seed % 500
        elif self.split == "val":
            index = seed % 1000 + 500
        else:
            index = seed % (n - 1500) + 1500
        return self._order[index]

    def available_actions(self) -> list[str]:
        """The page's actions as shown to the model (the last page hides "next >")."""
        page = self.env.get_available_actions()
        actions = ["search[<content>]"] if page["has_search_bar"] else []
        actions += [f"click[{c}]" for c in page["clickables"] if c != "search"]
        if actions == ["click[back to search]", "click[< prev]", "click[next >]"]:
            actions.remove("click[next >]")
        return actions

    def _render(self, observation: str) -> str:
        return (observation + "." + "\n".join(HINTS) + "\n You must choose from these actions:"
                + ", ".join(self.available_actions()) + ".")

    def reset(self, seed: int) -> str:
        observation, _ = self.env.reset(session=self.goal_index(seed))
        return self._render(observation)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        page = self.env.get_available_actions()
        name, arg = parse_action(action)
        valid = (name == "search" and page["has_search_bar"] and bool(arg)) or (
            name == "click" and arg in page["clickables"] and arg != "search")
        before = self.env.observation
        observation, raw, done, info = self.env.step(action)
        reward = 1.0 if raw >= 1.0 else 0.0
        info = dict(info or {})
        info.update(raw_reward=float(raw), success=reward == 1.0, action_is_valid=valid,
                    action_is_effective=self.env.observation != before,
                    success_purchase=bool(done))
        return self._render(observation), reward, bool(done), info

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


register("webshop", WebShopEnv)
