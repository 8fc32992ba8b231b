"""The README's env=python example, as written there (test_python_env.py checks that the README holds this very
text once it documents env=python, and runs it)."""

import openmanus_rl_core as omrl


class Thermostat:
    """Bring the room to the target temperature, then call finish."""

    def reset(self, target: int = 21, start: int = 16) -> str:
        self.temp, self.target, self.done = start, target, False
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
        self.done = True
        return "Finished."

    def get_reward(self) -> float:
        return 1.0 if self.done and self.temp == self.target else 0.0


if __name__ == "__main__":
    metrics = omrl.train(["template=qwen_tools", "reward=python",
                          "env.kwargs.tasks=[{target:20,start:16},{target:22,start:19}]"], env=Thermostat)
    print(metrics["val/reward_mean"])
