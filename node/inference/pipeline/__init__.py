"""Distributed pipeline: a model split by layers across peers (DESIGN.md §8).

wire        WORK / ACK / RESULT / CANCEL / SESSION_END payloads and the activation codec
planner     route planning over the holders of a model's layers (pure)
sampler     token sampling in torch on the segment that holds the output head
host        the slices this node serves (SliceModel per layer range, one executor each)
worker      the segment side: WORK in, forward, hidden states on to the next hop, RESULT
holders     who holds which layers (this node's slices, peers' adverts), coverage, the chain
deadlines   a step's one future and its ACK/RESULT deadline timers (RTO-based)
perf        what RESULT telemetry measured: per-peer ms/layer and step time, per-hop overhead
run         PipelineRun: one request's prefill/decode loop, with failover
coordinator the API side: attempts, steps and frames of every request, with its collaborators
"""
