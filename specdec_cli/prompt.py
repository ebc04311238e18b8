"""The chat prompt for the description task.

Qwen2.5-Omni speaks ChatML. Its processor renders an audio item as
`<|audio_bos|><|AUDIO|><|audio_eos|>`; the processor below expands `<|AUDIO|>` into one
placeholder per audio frame the encoder emits. We render the prompt here rather than through the
processor's chat template, because that template lives on `Qwen2_5OmniProcessor`, which needs
torchvision (see field notes); the string is the same.
"""

from __future__ import annotations

SYSTEM = "You are a helpful assistant."
INSTRUCTION = "请用一句中文描述说话人的语速、音调、音量、停顿、音色和情绪。"

AUDIO_BOS = "<|audio_bos|>"
AUDIO = "<|AUDIO|>"
AUDIO_EOS = "<|audio_eos|>"

# The ChatML template shipped with the demo tokenizer. For string content it renders exactly what
# `render_prompt` does (a test checks that), so the bundled checkpoints and this module agree.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def messages(instruction: str = INSTRUCTION, system: str = SYSTEM) -> list[dict[str, str]]:
    """The conversation: a system turn, and a user turn holding the audio and the instruction."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{AUDIO_BOS}{AUDIO}{AUDIO_EOS}{instruction}"},
    ]


def render_prompt(instruction: str = INSTRUCTION, system: str = SYSTEM) -> str:
    """The prompt text, ending where the assistant's answer begins."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages(instruction, system))
    return turns + "<|im_start|>assistant\n"
