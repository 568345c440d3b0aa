"""The SwarmLLM desktop app: a tray icon and a window hosting a node on a qasync loop.

`app.main:main` is the `swarmllm-tray` console script. The node is the very same `node.node.Node`
that `swarmllm run` starts, awaited on qasync's QEventLoop (one loop, no thread hosting it).
"""
