"""Oracle demonstrations through the real sandboxed environment, in the RL token layout."""
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env.harness import EnvConfig, make_env
from composer_rl.env.policies import make_policy
from composer_rl.env.tasks import generated
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.scripted import scripted_trajectory


def test_oracle_demo_has_reward_one_and_loss_only_on_its_turns():
  tok = ByteTokenizer()
  chat = ChatFormat(tok)
  task = generated.generate("train", 0, 0)
  t = scripted_trajectory(make_policy("oracle"), task, make_env(task, EnvConfig(call_syntax="tool_compact")),
                          chat)
  assert t.reward == 1.0 and t.turns >= 2
  sampled = tok.decode([x for x, m in zip(t.tokens, t.loss_mask) if m])
  assert sampled == "".join(t.turn_texts)  # exactly the policy's text carries loss
  assert t.tokens.count(tok.EOT) >= 2 * t.turns  # every turn and observation is closed
  null = scripted_trajectory(make_policy("null"), task, make_env(task), chat)
  assert null.reward == 0.0
