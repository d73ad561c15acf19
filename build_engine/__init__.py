"""Build stage: checkpoints in, engine directories out.

Everything that knows about a model family's Hugging Face conventions lives here; the runtime only
ever sees canonical layer types and canonical weight names.
"""
