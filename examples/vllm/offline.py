"""Offline generation with vLLM's tensor-parallel collectives through pyccl.

    PYCCL_VLLM=1 python offline.py --model meta-llama/Llama-3.1-70B-Instruct --tp 4
"""

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tp", type=int, default=4)
    args = parser.parse_args()
    if os.environ.get("PYCCL_VLLM") != "1":
        raise SystemExit("set PYCCL_VLLM=1 so that every vLLM process runs pyccl's general plugin")
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, tensor_parallel_size=args.tp)
    for out in llm.generate(["The capital of France is"], SamplingParams(max_tokens=32)):
        print(out.outputs[0].text)


if __name__ == "__main__":
    main()
