"""Learned flows: what an attempt that succeeded did, synthesised, retrieved and replayed.

`params` turns the text a run typed from its goal into goal parameters; `synthesis` makes a
`amc.v1.Flow` from an attempt's steps; `scoring` is the local lexical scorer retrieval uses by
default; `replay` replays a flow inside `plan_step` (both transports) and says when to hand
over to the model.
"""
