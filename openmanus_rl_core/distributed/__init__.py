"""Running workers on Ray: the worker group, Ray start-up and sizing, FSDP2 wrapping and state dicts, placement.

- :mod:`.worker_group`: Ray actors forming one process group; a failing rank stops the group at once;
- :mod:`.sizing`: starting Ray and the actor (and critic) groups with each worker's share of the machine;
- :mod:`.sharding`: a batch split among the ranks and put back together;
- :mod:`.fsdp`: FSDP2 wrapping and full state dicts;
- :mod:`.placement`: placement groups (one bundle per rank);
- :mod:`.ray_node`: the Ray a run uses (a private one on 127.0.0.1, or a cluster joined by address).
"""
