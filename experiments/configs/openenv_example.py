"""An OpenEnv server's env trained with GRPO, CPU-sized (the openenv extra).

    python tests/helpers/openenv_game.py --port 8000 &      # the tests' guessing game, served
    python experiments/run.py --config openenv_example.py --workdir runs/openenv

The env is the server at URL (env.name "openenv:<url>", envs_host.openenv_client; another
server: --config.env.name=openenv:http://host:port). env.kwargs map its typed action and
observation to text: the answer goes into the action's field "message", the observation's
field "text" is shown, its field "solved" is the success. The server must allow as many
WebSocket sessions as a rollout has rows (groups x group_size = 32; OpenEnv's
max_concurrent_envs). CPU-sized as quickstart.py: NoThink answers of up to 12 tokens, 3 guesses
an episode, 4 groups x 8 rollouts; 8 held-out games evaluated greedy after the last step (a
CPU-sized evaluation, not the validation protocol of record).
"""

from starpo_jax.run.schema import config_for

URL = "http://127.0.0.1:8000"


def get_config():
    c = config_for(f"openenv:{URL}", "grpo", groups=4, group_size=8, max_turns=3,
                   max_actions_per_turn=1, max_actions_per_traj=3, reply_tokens=12)
    c.nothink = True
    c.steps = 16
    c.optim.actor_lr = 5e-6
    c.env.kwargs = {
        "action_field": "message", "observation_field": "text", "success_field": "solved",
        "instructions": "Guess the hidden number from 1 to 9 in 3 tries; after a wrong guess "
                        "you are told Higher or Lower. Answer like <answer>5</answer>.",
        "timeout": 20, "retry_seconds": 30,  # below host.timeout (60 s): see the docs
    }
    c.eval_every = c.steps  # once, after the last step
    c.eval.update(episodes=8, modes="greedy", seed=None)
    c.val_before_train = False
    c.checkpoint_every = 8
    return c
