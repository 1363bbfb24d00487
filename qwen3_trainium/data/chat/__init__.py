"""Chat data for supervised fine-tuning (``data=chat``): records in four formats, the model's own
chat template, exact loss masks, packing with per-document positions.

Pure Python up to the packed rows (``records``, ``template``, ``masks``, ``stream``), so pre-flight
and the preview use the very code the ranks run; ``loader`` wraps it for torchtitan (torch).
"""
