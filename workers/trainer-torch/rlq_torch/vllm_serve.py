"""vLLM's OpenAI-compatible server with rlq's "gloo" weight transfer backend registered (vllm_gloo.py):

    PYTHONPATH=workers/trainer-torch VLLM_SERVER_DEV_MODE=1 python -m rlq_torch.vllm_serve \\
        --model M --weight-transfer-config '{"backend": "gloo"}' [vLLM's other server flags]

It takes vLLM's server flags as `python -m vllm.entrypoints.openai.api_server` does. The registration
runs at import, not under `__main__`, on purpose: vLLM's CPU build starts its engine core with the
spawn method, and a spawned child imports the parent's `-m` module again (as __mp_main__) before it
runs anything, so the child that builds the weight transfer engine knows "gloo" too. Without this
module, an installed vLLM general plugin naming `rlq_torch.vllm_gloo:register` does the same.
"""

from rlq_torch.vllm_gloo import register

register()

if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
