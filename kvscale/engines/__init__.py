"""The engines' surface: the arguments kvscale passes to vLLM, SGLang and TGI, the parser of
a user's engine command line, and the names its knobs carry on the CLI and in the resource.
Every flag here is checked against the engine's own source (cited where it is used)."""
