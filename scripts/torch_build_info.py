"""Print what CMake needs to know about the installed torch, as KEY=VALUE lines."""
import os

import torch
from torch.utils import cpp_extension

torch_dir = os.path.dirname(torch.__file__)
print(f"TORCH_VERSION={torch.__version__}")
print(f"TORCH_CUDA_VERSION={torch.version.cuda}")
print(f"TORCH_DIR={torch_dir}")
print(f"TORCH_LIB_DIR={os.path.join(torch_dir, 'lib')}")
print(f"TORCH_INCLUDE_DIRS={'|'.join(cpp_extension.include_paths())}")
print(f"TORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
