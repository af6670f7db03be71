"""A small shop with WebShop's text pages, for testing the WebShop adapter without its data.

Pages, in WebShop's text observation mode (fields joined by " [SEP] "):
  search:  WebShop [SEP] Instruction: [SEP] <goal> [SEP] Search
  results: ... [SEP] Back to Search [SEP] Page 1 (Total results: 4) [SEP] Next > [SEP]
           <ASIN> [SEP] <name> [SEP] $<price> ...            (3 products a page)
  item:    ... [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] small [SEP] large ...
           [SEP] <name> [SEP] Price: $<price> [SEP] Rating: N.A. [SEP] Description [SEP]
           Features [SEP] Reviews [SEP] Buy Now
Clickables are lower-cased as WebShop's. The score at "buy now" follows WebShop's shape: the
share of the goal's attributes, options and price bound that the bought product and the
chosen options meet (1.0 = all), 0 for a product of another type.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

PRODUCTS = [
    dict(asin="B000SHIRT1", name="Red Cotton Shirt", kind="shirt", price=19.99,
         attributes={"cotton"}, options={"size": ["small", "large"], "color": ["red"]}),
    dict(asin="B000SHIRT2", name="Blue Linen Shirt", kind="shirt", price=29.5,
         attributes={"linen"}, options={"size": ["small", "large"], "color": ["blue"]}),
    dict(asin="B000SHIRT3", name="Green Cotton Shirt Deluxe", kind="shirt", price=79.0,
         attributes={"cotton"}, options={"size": ["medium"], "color": ["green"]}),
    dict(asin="B000MUG001", name="Ceramic Coffee Mug", kind="mug", price=9.0,
         attributes={"ceramic"}, options={"color": ["white", "black"]}),
]
GOALS = [
    dict(asin="B000SHIRT1", kind="shirt", instruction_text="i need a cotton shirt, size large, "
         "price lower than 40.00 dollars", attributes={"cotton"}, options={"large"},
         price_upper=40.0),
    dict(asin="B000MUG001", kind="mug", instruction_text="i want a black ceramic mug, price "
         "lower than 20.00 dollars", attributes={"ceramic"}, options={"black"}, price_upper=20.0),
]
PER_PAGE = 3


class CatalogueTextEnv:
    """WebShop's text env interface over PRODUCTS and GOALS (see the module docstring)."""

    def __init__(self):
        self.server = SimpleNamespace(goals=GOALS)
        self.goal = None
        self.observation = ""

    def _head(self) -> list[str]:
        return ["WebShop", "Instruction:", self.goal["instruction_text"]]

    def _show(self, page: str, **state) -> str:
        self.page, self.state = page, state
        head = self._head()
        if page == "search":
            fields = head + ["Search"]
        elif page == "results":
            hits, number = state["hits"], state["number"]
            shown = hits[(number - 1) * PER_PAGE: number * PER_PAGE]
            fields = head + ["Back to Search"] + (["< Prev"] if number > 1 else []) + [
                f"Page {number} (Total results: {len(hits)})", "Next >"]
            for p in shown:
                fields += [p["asin"], p["name"], f"${p['price']}"]
        else:
            p = state["product"]
            fields = head + ["Back to Search", "< Prev"]
            for option, values in p["options"].items():
                fields += [option] + values
            fields += [p["name"], f"Price: ${p['price']}", "Rating: N.A.", "Description",
                       "Features", "Reviews", "Buy Now"]
        self.observation = " [SEP] ".join(fields)
        return self.observation

    def get_available_actions(self) -> dict:
        if self.page == "search":
            return {"has_search_bar": True, "clickables": ["search"]}
        if self.page == "results":
            number, hits = self.state["number"], self.state["hits"]
            shown = hits[(number - 1) * PER_PAGE: number * PER_PAGE]
            return {"has_search_bar": False, "clickables": ["back to search"] + (
                ["< prev"] if number > 1 else []) + ["next >"] + [p["asin"].lower()
                                                                  for p in shown]}
        p = self.state["product"]
        return {"has_search_bar": False, "clickables": [
            "back to search", "< prev", *[v for vs in p["options"].values() for v in vs],
            "description", "features", "reviews", "buy now"]}

    def reset(self, session: int):
        self.goal = GOALS[session]
        return self._show("search"), None

    def _score(self, product: dict, chosen: set[str]) -> float:
        if product["kind"] != self.goal["kind"]:
            return 0.0
        wanted = len(self.goal["attributes"]) + len(self.goal["options"]) + 1
        met = len(self.goal["attributes"] & product["attributes"])
        met += len(self.goal["options"] & chosen) + (product["price"] <= self.goal["price_upper"])
        return met / wanted

    def step(self, action: str):
        match = re.match(r"^\s*(\w+)\s*\[(.*)\]\s*$", action, re.DOTALL)
        name, arg = (match.group(1).lower(), match.group(2).strip().lower()) if match \
            else (action, None)
        page = self.get_available_actions()
        if name == "search" and page["has_search_bar"] and arg:
            words = set(arg.split())
            hits = sorted((p for p in PRODUCTS if words & set(p["name"].lower().split())),
                          key=lambda p: -len(words & set(p["name"].lower().split())))
            return self._show("results", hits=hits, number=1), 0.0, False, None
        if name != "click" or arg not in page["clickables"]:
            return self.observation, 0.0, False, None  # WebShop ignores an invalid action
        if arg == "back to search":
            return self._show("search"), 0.0, False, None
        if self.page == "results":
            number, hits = self.state["number"], self.state["hits"]
            if arg in ("next >", "< prev"):
                number += 1 if arg == "next >" else -1
                return self._show("results", hits=hits, number=number), 0.0, False, None
            product = next(p for p in PRODUCTS if p["asin"].lower() == arg)
            return self._show("item", product=product, chosen=set(), back=(hits, number)), \
                0.0, False, None
        if arg == "< prev":
            hits, number = self.state["back"]
            return self._show("results", hits=hits, number=number), 0.0, False, None
        if arg == "buy now":
            return self.observation, self._score(self.state["product"], self.state["chosen"]), \
                True, None
        if arg in ("description", "features", "reviews"):
            return self.observation, 0.0, False, None
        self.state["chosen"].add(arg)
        return self.observation, 0.0, False, None
