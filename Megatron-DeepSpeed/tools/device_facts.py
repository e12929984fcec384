"""Print this node's accelerator facts as one JSON line (megatron/device_probe.py): kind, count, bf16 support,
fp16 overflow detection, memory per device and whether the trainer's attention kernel gets grouped K/V repeated,
after the NPU adaptor's one-line summary.
tools/launch_training.py runs it as a child process so that the launcher itself never opens a device."""


def main(argv=None):
    from deepspeed_npu import activate
    npu = activate()
    print(npu.summary, flush=True)  # explains a missing or broken torch_npu / CANN
    from megatron.device_probe import read_device_facts
    from megatron.planning.command_line import with_kernel_answers
    print(with_kernel_answers(read_device_facts(), npu.kernels).to_json(), flush=True)


if __name__ == "__main__":
    from megatron.errors import run_cli
    run_cli(main)
