"""The performance model and its calibration: FLOPs (flops), memory (memory), communication layout
(comm_layout) and what a step communicates (traffic), step time (perfmodel, fitted constants in
params), calibration from measurements (calibration, its inputs and types, compute_calibration),
checks against measured runs (check) and against the paper (validation), and the text the CLI prints
(text). Pure: no torch, no I/O beyond reading records and references."""
