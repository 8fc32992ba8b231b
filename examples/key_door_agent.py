"""An agent written against the OpenAI API, trained unmodified: as a program run once per episode, or as an async
function run inside the trainer's workers (no process per episode).

    openmanus-rl train env=key_door template=react agent.command="python examples/key_door_agent.py"
    PYTHONPATH=. openmanus-rl train env=key_door template=react agent.function=examples.key_door_agent:play
"""
import asyncio
import json
import os

from openai import AsyncOpenAI
from openmanus_rl_env_text.key_door import KeyDoorEnv
from openmanus_rl_templates.react import ReactTemplate


async def play(client, task, model):
    env, template = KeyDoorEnv(), ReactTemplate()
    messages = [{"role": "system", "content": template.system_prompt(env.instruction)},
                {"role": "user", "content": env.reset(task["task_id"], task["seed"])}]
    reward, success = 0.0, False
    for turn in range(4):
        out = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=64, stop=["</action>"],
            extra_body={"include_stop_str_in_output": True})  # the reply as sampled: one sample per episode
        reply = out.choices[0].message.content
        messages.append({"role": "assistant", "content": reply})
        result = env.step(template.parse(reply).content)
        reward, success = reward + result.reward, bool(result.info.get("success"))
        if result.done:
            break
        messages.append({"role": "user", "content": result.observation})
    await client.post("/rl/reward", body={"reward": reward, "success": success}, cast_to=object)


if __name__ == "__main__":  # OPENAI_BASE_URL and OPENAI_API_KEY: the trainer's gateway and this episode's key
    asyncio.run(play(AsyncOpenAI(), json.loads(os.environ["OMRL_TASK"]), os.environ["OMRL_MODEL"]))
