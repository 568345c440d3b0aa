"""The models room: which GGUF files this node has (catalog, ids, header metadata) and how new ones
arrive (downloads). Below the engines: nothing here imports node.inference, node.net or node.api."""
