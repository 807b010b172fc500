"""Ranges in code nobody edits: :mod:`.instrument` wraps attributes at run time,
:mod:`.nn_modules` hooks torch modules, and :mod:`.presets` holds one table per framework (verl,
vLLM, SGLang, MindSpeed-RL, Megatron) of the places it does its work.
"""
