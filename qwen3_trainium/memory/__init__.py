"""Memory and time before launch, run by pre-flight in the parent (the estimate) or in a helper
process (``python -m qwen3_trainium.memory.trace``): the per-rank estimate, the trace of the second step
on fake tensors through a rank's own config, and the roofline step time.
"""
