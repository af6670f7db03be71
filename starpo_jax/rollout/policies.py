"""Scripted policies that play a JAX env, for demonstrations (starpo_jax.rollout.demonstrations).

    policy = make_policy("solver", env, max_actions_per_turn=5, max_turns=5,
                         max_actions_per_traj=10)
    actions = policy(state, key)     # one env state -> [A] int32, -1 after the turn's actions

A policy is any function `(env_state, key) -> actions`: one (unbatched) state of a JAX env, a
PRNG key, and the turn's actions as ids into env.action_names, A = max_actions_per_turn of them
at most, padded with -1 (the first -1 ends the turn). By name:
  random: 1 to A uniformly random actions (every action id is a valid move in the grid games:
    it teaches the answer format and nothing of the task);
  solver: Sokoban (one box): shortest-path moves from a breadth-first search over (player, box)
    cells, computed in JAX with the env's own step; FrozenLake: the optimal policy of the
    slippery MDP within the action budget (finite-horizon value iteration in JAX), played along
    the path the intended moves would take, ceil(budget / turns) actions a turn; Bandit: the
    high-risk arm; Countdown: an expression of the given numbers that equals the target, from
    an exhaustive search in JAX over the generator's own space (combine two values at a time
    with +, the larger minus the smaller, *, or an exact division; + and - only when the env
    keeps only such instances), so every generated instance is solved; Sudoku: the solution's
    digits in the first empty cells, up to A placements a turn; an env with a
    `solver_policy(max_actions_per_turn)` method: its own (the 2x2 Rubik's cube: the first A
    turns of an optimal plan, envs_jax.rubiks_cube.solver).
  mix: each turn independently, the solver's moves with probability `solver_share` (default
    0.5), else the random policy's: the format from the random turns, the task (from whatever
    state the random turns left) from the solver's.

Free-text envs (Countdown, Sudoku) have no action names: there a policy returns the answer's
text as ids into `answer_symbols(env, sep)` ([W] int32, W = answer_width(env, A), EMPTY
padded; SEPARATOR is the action separator between items), spelt in the env's own answer
format (Countdown: "(12 + 5) - 3"; Sudoku: "2,3,5" for 5 at row 2 col 3, the shortest format
its instructions show). Their `random` policy: Countdown, a random expression of the numbers
(the right format; the target by chance, on 18% of `countdown`'s instances, 7% of
`countdown_5`'s); Sudoku, 1 to A random digits in random empty cells.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.bandit.env import Bandit
from envs_jax.countdown import generator as countdown_generator
from envs_jax.countdown.env import Countdown
from envs_jax.frozen_lake import types as fl
from envs_jax.frozen_lake.env import FrozenLake
from envs_jax.sokoban.env import Sokoban
from envs_jax.sudoku.env import Sudoku
from starpo_jax.text.blocks import concat_pieces

Policy = Callable[[Any, jax.Array], jax.Array]
POLICY_NAMES = ("random", "solver", "mix")
_SOLVED_ENVS = (Sokoban, FrozenLake, Bandit, Countdown, Sudoku)


def make_policy(name: str, env: Any, *, max_actions_per_turn: int, max_turns: int,
                max_actions_per_traj: int, solver_share: float = 0.5) -> Policy:
    """The policy called `name` (POLICY_NAMES) for `env`; `solver_share` is "mix"'s chance of a
    solver turn. Raises ValueError naming the valid names, or the envs that have a solver."""
    if name == "random":
        return random_policy(env, max_actions_per_turn)
    if name == "mix":
        if not 0 <= solver_share <= 1:
            raise ValueError(f"solver_share = {solver_share!r} is not a probability; valid: a "
                             "number in [0, 1]")
        solver = make_policy("solver", env, max_actions_per_turn=max_actions_per_turn,
                             max_turns=max_turns, max_actions_per_traj=max_actions_per_traj)
        return mixed_policy(random_policy(env, max_actions_per_turn), solver, solver_share)
    if name != "solver":
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICY_NAMES)} or a "
                         "function (env_state, key) -> actions")
    if isinstance(env, Sokoban):
        return sokoban_solver(env, max_actions_per_turn)
    if isinstance(env, FrozenLake):
        per_turn = min(max_actions_per_turn, math.ceil(max_actions_per_traj / max_turns))
        return frozen_lake_solver(env, max_actions_per_turn, per_turn, max_actions_per_traj)
    if isinstance(env, Bandit):
        return bandit_solver(env, max_actions_per_turn)
    if isinstance(env, Countdown):
        return countdown_policy(env, solve=True)
    if isinstance(env, Sudoku):
        return sudoku_solver(env, max_actions_per_turn)
    if hasattr(env, "solver_policy"):  # an env that brings its own (the Rubik's cube)
        return env.solver_policy(max_actions_per_turn)
    raise ValueError(f"no 'solver' policy for {type(env).__name__}; valid: 'random', or "
                     f"'solver' for {', '.join(e.__name__ for e in _SOLVED_ENVS)} and envs "
                     "with a solver_policy(max_actions_per_turn) method")


def _padded(actions: jax.Array, count: jax.Array) -> jax.Array:
    """actions [A] int32 with -1 from position `count` on."""
    return jnp.where(jnp.arange(actions.shape[0]) < count, actions, -1).astype(jnp.int32)


def random_policy(env: Any, max_actions_per_turn: int) -> Policy:
    """1..A uniformly random action ids (A = max_actions_per_turn); for Countdown and Sudoku
    random answers (module docstring)."""
    if isinstance(env, Countdown):
        return countdown_policy(env, solve=False)
    if isinstance(env, Sudoku):
        return sudoku_random(env, max_actions_per_turn)
    names = len(env.action_names)
    if names == 0:
        raise ValueError(f"{type(env).__name__} has no action names (a free-text env); the "
                         "'random' policy picks among action names, or answers of Countdown "
                         "and Sudoku")

    def policy(state: Any, key: jax.Array) -> jax.Array:
        count_key, action_key = jax.random.split(key)
        count = jax.random.randint(count_key, (), 1, max_actions_per_turn + 1)
        return _padded(jax.random.randint(action_key, (max_actions_per_turn,), 0, names), count)

    return policy


def mixed_policy(first: Policy, second: Policy, second_share: float) -> Policy:
    """Each call (a turn) plays `second` with probability `second_share`, else `first`; the two
    must return actions of one shape and dtype."""

    def policy(state: Any, key: jax.Array) -> jax.Array:
        coin_key, first_key, second_key = jax.random.split(key, 3)
        pick = jax.random.bernoulli(coin_key, second_share)
        return jnp.where(pick, second(state, second_key), first(state, first_key))

    return policy


def bandit_solver(env: Bandit, max_actions_per_turn: int) -> Policy:
    """Always the high-risk arm (id 1: the arm with the higher expected reward in RAGEN)."""
    del env

    def policy(state: Any, key: jax.Array) -> jax.Array:
        return _padded(jnp.ones((max_actions_per_turn,), jnp.int32), 1)

    return policy


_UNREACHED = 1 << 20


def sokoban_distances(env: Sokoban, state: Any) -> tuple[jax.Array, jax.Array]:
    """Shortest solution lengths of a one-box level from every (player, box) cell pair.

    state: one Sokoban state (its walls and targets are read). Returns (distances [N * N]
    int32, index N * player + box, _UNREACHED where no solution; next [N * N, 4] int32, the
    pair each action leads to), N = rows * cols. Moves are `env.step`'s own.
    """
    rows, cols = env.dim_room
    n = rows * cols
    cells = jnp.arange(n)
    player = jnp.repeat(cells, n)
    box = jnp.tile(cells, n)

    def step(p, b, action):
        boxes = (jnp.arange(n) == b).reshape(rows, cols)
        s = state.replace(player=jnp.stack([p // cols, p % cols]).astype(jnp.int32), boxes=boxes,
                          step_count=jnp.int32(0), success=jnp.bool_(False))
        new, _ = env.step(s, action)
        return new.player[0] * cols + new.player[1], jnp.argmax(new.boxes.reshape(-1))

    actions = jnp.arange(4)
    p2, b2 = jax.vmap(lambda p, b: jax.vmap(lambda a: step(p, b, a))(actions))(player, box)
    nxt = (p2 * n + b2).astype(jnp.int32)  # [N * N, 4]
    solved = state.targets.reshape(-1)[box]
    start = jnp.where(solved, 0, _UNREACHED).astype(jnp.int32)

    def relax(carry):
        dist, _ = carry
        new = jnp.minimum(dist, 1 + jnp.min(dist[nxt], axis=1))
        return new, jnp.any(new != dist)

    dist, _ = jax.lax.while_loop(lambda c: c[1], relax, (start, jnp.bool_(True)))
    return dist, nxt


def sokoban_solver(env: Sokoban, max_actions_per_turn: int) -> Policy:
    """Up to A moves of a shortest solution (fewer when it is shorter); an unsolvable level
    (a deadlock) gets one Up."""
    if env.num_boxes != 1:
        raise ValueError(f"the Sokoban solver policy handles num_boxes=1; this env has "
                         f"num_boxes={env.num_boxes}")
    rows, cols = env.dim_room
    n = rows * cols

    def policy(state: Any, key: jax.Array) -> jax.Array:
        dist, nxt = sokoban_distances(env, state)
        box = jnp.argmax(state.boxes.reshape(-1))
        here = (state.player[0] * cols + state.player[1]) * n + box

        def move(s, _):
            action = jnp.argmin(dist[nxt[s]]).astype(jnp.int32)
            return nxt[s, action], action

        _, actions = jax.lax.scan(move, here, None, length=max_actions_per_turn)
        left = dist[here]
        count = jnp.where(left >= _UNREACHED, 1, jnp.clip(left, 1, max_actions_per_turn))
        return _padded(jnp.where(left >= _UNREACHED, 3, actions), count)  # 3: Up

    return policy


def frozen_lake_values(env: FrozenLake, tiles: jax.Array, horizon: int) -> jax.Array:
    """Q[h, cell, action]: the best probability of reaching the goal with h + 1 actions left,
    taking `action` first, from each cell of a map (tiles [S, S] int32), under the env's slip
    (when slippery: the intended direction with probability env.success_rate, each
    perpendicular one (1 - success_rate) / 2; gymnasium's default 1/3 each). [H, S*S, 4]
    float32, H = horizon."""
    size = env.size
    cells = jnp.arange(size * size)
    pos = jnp.stack([cells // size, cells % size], axis=1)
    moves = jnp.asarray(fl.MOVES, jnp.int32)
    flat = tiles.reshape(-1)
    slips = (-1, 0, 1) if env.slippery else (0,)
    p = float(env.success_rate) if env.slippery else 1.0
    weights = jnp.asarray([(1 - p) / 2, p, (1 - p) / 2] if env.slippery else [1.0], jnp.float32)

    def lands(action):  # [S*S, len(slips)] the cell each slip lands on
        d = (action + jnp.asarray(slips)) % 4
        to = jnp.clip(pos[:, None, :] + moves[d][None], 0, size - 1)
        return to[..., 0] * size + to[..., 1]

    landing = jax.vmap(lands)(jnp.arange(4))  # [4, S*S, k]
    goal = (flat == fl.GOAL).astype(jnp.float32)
    alive = (flat == fl.FROZEN).astype(jnp.float32)

    def backup(value, _):  # value [S*S]: best with h actions left, from a frozen cell
        after = goal[landing] + alive[landing] * value[landing]  # [4, S*S, k]
        q = (after * weights).sum(-1).T  # [S*S, 4]
        return jnp.max(q, axis=1), q

    _, qs = jax.lax.scan(backup, jnp.zeros(size * size, jnp.float32), None, length=horizon)
    return qs


def frozen_lake_solver(env: FrozenLake, max_actions_per_turn: int, per_turn: int,
                       budget: int) -> Policy:
    """`per_turn` actions of the finite-horizon optimal policy (horizon = the action budget
    left, from the state's step count), each chosen at the cell the previous intended move
    would reach (a turn's actions are fixed before they are taken)."""
    size = env.size
    moves = jnp.asarray(fl.MOVES, jnp.int32)

    def policy(state: Any, key: jax.Array) -> jax.Array:
        qs = frozen_lake_values(env, state.tiles, budget)

        def act(carry, _):
            at, used = carry
            left = jnp.clip(budget - state.step_count - used, 1, budget)
            action = jnp.argmax(qs[left - 1, at[0] * size + at[1]]).astype(jnp.int32)
            return (jnp.clip(at + moves[action], 0, size - 1), used + 1), action

        _, actions = jax.lax.scan(act, (state.player, jnp.int32(0)), None,
                                  length=max_actions_per_turn)
        return _padded(actions, per_turn)

    return policy


# ---------------------------------------------------------------- free-text envs: answer text

EMPTY, SEPARATOR = 0, 1  # answer symbol ids of every free-text env: nothing; the separator
_CD_OPS = (" + ", " - ", " * ", " / ")
_CD_DIGIT, _CD_OP, _CD_OPEN, _CD_CLOSE = 2, 12, 16, 17
_CD_NUMBER_WIDTH = len(str(countdown_generator.MAX_NUMBER))  # digits per given number
_SD_COMMA, _SD_DIGIT = 2, 2  # digit d (1..9) is _SD_DIGIT + d
_SD_MOVE = 5  # symbols per move: R,C,N
#: Countdown's largest search (expressions per number count; 5 numbers, all operations: 46080).
MAX_COUNTDOWN_PROGRAMS = 100_000


def answer_symbols(env: Any, separator: str) -> tuple[str, ...]:
    """Symbol id -> text of a free-text env's demonstration answers: "" (EMPTY), `separator`
    (SEPARATOR, as it stands between items: " || "), then the env's pieces. Raises ValueError
    for an env without a spelling (one with action names, or an unknown free-text env)."""
    if isinstance(env, Countdown):
        pieces: tuple[str, ...] = (*"0123456789", *_CD_OPS, "(", ")")
    elif isinstance(env, Sudoku):
        pieces = (",", *"123456789")
    else:
        raise ValueError(f"{type(env).__name__} has no answer spelling for demonstrations; "
                         "valid free-text envs: Countdown, Sudoku")
    return ("", separator, *pieces)


def answer_width(env: Any, max_actions_per_turn: int) -> int:
    """W: the most symbols a demonstration answer of `env` takes."""
    if isinstance(env, Countdown):  # numbers, and "(" op ")" per combination
        return _CD_NUMBER_WIDTH * env.max_numbers + 3 * (env.max_numbers - 1)
    if isinstance(env, Sudoku):
        return max_actions_per_turn * (_SD_MOVE + 1) - 1
    raise ValueError(f"{type(env).__name__} has no answer spelling for demonstrations")


def answer_bytes(env: Any, max_actions_per_turn: int, separator: str) -> int:
    """The most UTF-8 bytes a demonstration answer of `env` takes (hence tokens)."""
    if isinstance(env, Countdown):  # parentheses around all combinations but the last
        m = env.max_numbers
        return _CD_NUMBER_WIDTH * m + 3 * (m - 1) + 2 * max(m - 2, 0)
    if isinstance(env, Sudoku):
        move = len("9,9,9")
        return max_actions_per_turn * move + (max_actions_per_turn - 1) * len(
            separator.encode("utf-8"))
    raise ValueError(f"{type(env).__name__} has no answer spelling for demonstrations")


def countdown_programs(count: int, operations: int) -> np.ndarray:
    """Every way to combine `count` values two at a time: [P, count - 1, 3] int32 steps
    (i, j, op), i < j slots still live; the result replaces slot i, slot j is dropped; op
    indexes _CD_OPS (+, larger - smaller, *, larger / smaller) below `operations`."""
    def expand(live: tuple[int, ...]) -> list[list[tuple[int, int, int]]]:
        if len(live) == 1:
            return [[]]
        out = []
        for i, j in itertools.combinations(live, 2):
            rest = expand(tuple(k for k in live if k != j))
            out += [[(i, j, op), *tail] for op in range(operations) for tail in rest]
        return out

    return np.asarray(expand(tuple(range(count))), np.int32).reshape(-1, count - 1, 3)


def _number_symbols(value: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[] int -> (its decimal digits as answer symbols [_CD_NUMBER_WIDTH], left aligned;
    length)."""
    powers = 10 ** jnp.arange(_CD_NUMBER_WIDTH - 1, -1, -1)
    shown = (value >= powers) | (powers == 1)
    length = jnp.sum(shown)
    digits = _CD_DIGIT + (value // powers) % 10
    return jnp.roll(jnp.where(shown, digits, EMPTY), length - _CD_NUMBER_WIDTH), length


def _countdown_answer(nums: jax.Array, program: jax.Array, width: int) -> jax.Array:
    """The text of one program over nums [count]: [width] answer symbols, each combination in
    parentheses but the last, its larger operand first for - and /."""
    count = nums.shape[0]
    texts, lengths = jax.vmap(_number_symbols)(nums)
    texts = jnp.pad(texts, ((0, 0), (0, width - _CD_NUMBER_WIDTH)), constant_values=EMPTY)
    values = nums
    one = jnp.int32(1)
    for s in range(count - 1):
        i, j, op = program[s]
        a, b = values[i], values[j]
        swap = (op % 2 == 1) & (b > a)  # - and /: the larger first
        first, second = jnp.where(swap, j, i), jnp.where(swap, i, j)
        outer = one if s < count - 2 else jnp.int32(0)
        ids, n = concat_pieces([(jnp.array([_CD_OPEN]), outer), (texts[first], lengths[first]),
                                (jnp.array([_CD_OP]) + op, one),
                                (texts[second], lengths[second]), (jnp.array([_CD_CLOSE]), outer)])
        texts = texts.at[i].set(jnp.where(ids[:width] >= 0, ids[:width], EMPTY))
        lengths = lengths.at[i].set(n)
        values = values.at[i].set(_combine(a, b, op)[0])
    return texts[0]


def _combine(a: jax.Array, b: jax.Array, op: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(value, exact) of the generator's combination `op` of a and b: +, larger - smaller, *,
    larger / smaller when it divides; exact False past the generator's limit."""
    hi, lo = jnp.maximum(a, b), jnp.minimum(a, b)
    limit = countdown_generator._LIMIT
    product_ok = (lo == 0) | (hi <= limit // jnp.maximum(lo, 1))
    safe = jnp.maximum(lo, 1)
    value = jnp.select([op == 0, op == 1, op == 2], [a + b, hi - lo, jnp.where(
        product_ok, a * b, limit)], hi // safe)
    exact = jnp.where(op == 3, (lo != 0) & (hi % safe == 0), op != 2) | ((op == 2) & product_ok)
    return value, exact & (value < limit)


def countdown_policy(env: Countdown, *, solve: bool) -> Policy:
    """solve: the first expression (in `countdown_programs` order) equal to the target, else
    the first of them (all +: the right format, reward 0.1); not solve: a uniformly random
    one. One answer, [W] answer symbols (module docstring)."""
    operations = 2 if env.plus_minus_only else 4
    most = math.prod(math.comb(k, 2) * operations for k in range(2, env.max_numbers + 1))
    if most > MAX_COUNTDOWN_PROGRAMS:
        raise ValueError(f"the Countdown solver searches at most {MAX_COUNTDOWN_PROGRAMS} "
                         f"expressions; {env!r} has {most} (use fewer numbers)")
    programs = {c: countdown_programs(c, operations)
                for c in range(env.min_numbers, env.max_numbers + 1)}
    width = answer_width(env, 1)

    def one_count(state: Any, key: jax.Array, count: int) -> jax.Array:
        steps = jnp.asarray(programs[count])
        nums = state.nums[:count]
        if solve:
            def run(program):
                values, exact = nums, jnp.bool_(True)
                for i, j, op in program:
                    value, ok = _combine(values[i], values[j], op)
                    values, exact = values.at[i].set(value), exact & ok
                return exact & (values[0] == state.target)

            pick = jnp.argmax(jax.vmap(run)(steps))
        else:
            pick = jax.random.randint(key, (), 0, steps.shape[0])
        return _countdown_answer(nums, steps[pick], width)

    def policy(state: Any, key: jax.Array) -> jax.Array:
        answers = jnp.stack([one_count(state, key, c) for c in programs])
        return answers[state.count - env.min_numbers]

    return policy


def _sudoku_answer(rows: jax.Array, cols: jax.Array, nums: jax.Array,
                   count: jax.Array) -> jax.Array:
    """Moves [A] (1-based rows, cols, digits), the first `count` kept -> [W] answer symbols
    "R,C,N" joined by the separator."""
    comma = jnp.full_like(nums, _SD_COMMA)
    moves = jnp.stack([_SD_DIGIT + rows, comma, _SD_DIGIT + cols, comma, _SD_DIGIT + nums,
                       jnp.full_like(nums, SEPARATOR)], axis=1)
    keep = (jnp.arange(nums.shape[0]) < count)[:, None]
    keep = keep & ((jnp.arange(_SD_MOVE + 1) < _SD_MOVE) | (jnp.arange(nums.shape[0]) + 1
                                                              < count)[:, None])
    return jnp.where(keep, moves, EMPTY).reshape(-1)[:-1].astype(jnp.int32)


def sudoku_solver(env: Sudoku, max_actions_per_turn: int) -> Policy:
    """The solution's digits in the first A empty cells (row-major); one move when none is
    empty (the episode has then ended)."""
    n = env.n

    def policy(state: Any, key: jax.Array) -> jax.Array:
        empty = state.grid.reshape(-1) == 0
        cells = jnp.argsort(~empty, stable=True)[:max_actions_per_turn]
        count = jnp.clip(jnp.sum(empty), 1, max_actions_per_turn)
        return _sudoku_answer(cells // n + 1, cells % n + 1,
                              state.solution.reshape(-1)[cells], count)

    return policy


def sudoku_random(env: Sudoku, max_actions_per_turn: int) -> Policy:
    """1..A moves, each a uniformly random digit in a uniformly random empty cell."""
    n = env.n

    def policy(state: Any, key: jax.Array) -> jax.Array:
        count_key, cell_key, digit_key = jax.random.split(key, 3)
        empty = state.grid.reshape(-1) == 0
        logits = jnp.where(empty | ~jnp.any(empty), 0.0, -jnp.inf)
        cells = jax.random.categorical(cell_key, logits, shape=(max_actions_per_turn,))
        nums = jax.random.randint(digit_key, (max_actions_per_turn,), 1, n + 1)
        count = jax.random.randint(count_key, (), 1, max_actions_per_turn + 1)
        return _sudoku_answer(cells // n + 1, cells % n + 1, nums, count)

    return policy


def answer_samples(env: Any, max_actions_per_turn: int, count: int, seed: int) -> np.ndarray:
    """Host: [count, W] answers of the solver and the random policy (half each) on random
    initial states, for checking the answer encoder against the tokenizer."""
    policies = [make_policy(name, env, max_actions_per_turn=max_actions_per_turn, max_turns=1,
                            max_actions_per_traj=max_actions_per_turn)
                for name in ("solver", "random")]

    @jax.jit
    def answers(key):
        reset_key, policy_key = jax.random.split(key)
        states = jax.vmap(env.reset)(jax.random.split(reset_key, count))[0]
        keys = jax.random.split(policy_key, count)
        both = [jax.vmap(p)(states, keys) for p in policies]
        return jnp.where((jnp.arange(count) < count // 2)[:, None], both[0], both[1])

    return np.asarray(jax.device_get(answers(jax.random.PRNGKey(seed))))
