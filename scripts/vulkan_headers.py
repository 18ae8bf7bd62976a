"""Let ggml-vulkan build against Vulkan headers that lack VK_EXT_layer_settings.

usage: python scripts/vulkan_headers.py LLAMA_CPP_DIR

The instance is then created without the validation layer's settings (they only tune
that layer, which a build like this never enables). Idempotent; says what it did.
"""

from __future__ import annotations

import sys
from pathlib import Path

SOURCE = "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
SETTINGS = "    std::vector<vk::LayerSettingEXT> settings = {"
CREATE = ("    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, "
          "layers, extensions, &layer_setting_info);\n")
GUARDED = ("#else\n    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, "
           "&app_info, layers, extensions);\n#endif\n")


def mend(text: str) -> str:
    """The source with the settings block and the create-info that uses it guarded."""
    if "#ifdef VK_EXT_layer_settings\n" + SETTINGS in text:
        return text
    if SETTINGS not in text or CREATE not in text:
        raise SystemExit(f"{SOURCE}: the instance creation changed; nothing to guard")
    text = text.replace(SETTINGS, "#ifdef VK_EXT_layer_settings\n" + SETTINGS, 1)
    return text.replace(CREATE, CREATE + GUARDED, 1)


def main(root: str) -> None:
    path = Path(root) / SOURCE
    path.write_text(mend(path.read_text()))
    print(f"{SOURCE}: VK_EXT_layer_settings guarded (for Vulkan headers without it)")


if __name__ == "__main__":
    main(sys.argv[1])
