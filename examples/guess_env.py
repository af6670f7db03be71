"""The README's own-environment example as a file: a one-turn number guess in plain Python.

Importing this module registers the host env "guess" (envs_host.register); run.py imports it
by name before it looks the env up, so the game trains from the command line:

    python experiments/run.py --config quickstart.py --config.env.module=examples.guess_env \
        --config.env.name=guess --workdir runs/guess

(from the repository's root: env.module is imported from the current directory or the Python
path; tests/test_first_hour.py trains it with the tiny model).
"""

import envs_host


class Guess(envs_host.HostEnv):
    instructions = "Guess the number between 1 and 9. Answer like <answer>5</answer>."
    settings = envs_host.EnvSettings(max_turns=1)  # one guess per game

    def reset(self, seed):
        self.n = seed % 9 + 1
        return "Guess."

    def step(self, action):
        hit = action.strip() == str(self.n)
        return ("Right." if hit else "Wrong."), float(hit), True, {"success": hit}


envs_host.register("guess", Guess)  # then config.env.name = "guess"
