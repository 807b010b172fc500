"""The model behind every figure: steps found once, each process's spans, the per-step
model (busy, idle, critical path, what-if, long tail), clock alignment and the per-phase
statistics. Renderers (:mod:`mstx_marks.analysis.render`) draw it; readers
(:mod:`mstx_marks.analysis.readers`) feed it."""
