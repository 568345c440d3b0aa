"""Distributed pipeline: a model split by layers across peers (DESIGN.md §8).

wire        WORK / ACK / RESULT / CANCEL / SESSION_END payloads and the activation codec
planner     route planning over the holders of a model's layers (pure)
sampler     token sampling in torch on the segment that holds the output head
host        the slices this node serves (SliceModel per layer range, one executor each)
worker      the segment side: WORK in, forward, hidden states on to the next hop, RESULT
coordinator the API side: one request through a chain of segments, with failover
"""
