"""The env=python example of docs/ecosystem-envs.md, as written there (test_python_env.py checks that the page holds
this very text, and runs it)."""

import json

import openmanus_rl_core as omrl
from openmanus_rl_core.data.tasks import write_tasks


class Thermostat:
    """Bring the room to the target temperature, then call finish."""

    def reset(self, target: int = 21, start: int = 16) -> str:
        self.temp, self.target, self.done, self.success = start, target, False, False
        return f"The room is at {start} degrees; the target is {target}."

    def heat(self, degrees: int) -> str:
        """Raise the temperature.

        Args:
            degrees: how many degrees to add, from 1 to 5
        """
        if not 1 <= degrees <= 5:
            raise ValueError("degrees must be from 1 to 5")
        self.temp += degrees
        return f"The room is at {self.temp} degrees."

    def finish(self) -> str:
        """Say that the room is ready; this ends the episode."""
        self.done, self.success = True, self.temp == self.target
        return "Finished."

    def get_reward(self) -> float:
        return 1.0 if self.success else 0.0


def demonstration(target: int, start: int) -> dict:
    """An expert's episode, for the warm-up: the first observation, then each call with what it returned."""
    room = Thermostat()
    first, steps = room.reset(target, start), []
    while room.temp < target:
        degrees = min(5, target - room.temp)
        steps.append([json.dumps({"name": "heat", "arguments": {"degrees": degrees}}), room.heat(degrees)])
    steps.append([json.dumps({"name": "finish", "arguments": {}}), room.finish()])
    return {"observation": first, "steps": steps}


if __name__ == "__main__":
    rooms = [{"target": 20, "start": 16}, {"target": 22, "start": 19}, {"target": 23, "start": 18},
             {"target": 21, "start": 20}]
    write_tasks("rooms.parquet", [dict(room, task_id=i, seed=i, demonstration=demonstration(**room))
                                  for i, room in enumerate(rooms * 16)])  # each row's columns go to reset()
    metrics = omrl.train(["template=qwen_tools", "reward=python", "data.train_files=rooms.parquet",
                          "data.val_files=rooms.parquet", "trainer.val_max_tasks=4", "trainer.total_steps=5"],
                         env=Thermostat)
    print(metrics["val/reward_mean"], metrics["val/success_rate"])
