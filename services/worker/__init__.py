"""The model worker: one replica of an endpoint (all-MiniLM-L6-v2 on onnxruntime)."""
