# Rewrites the kernel launches of a CUDA source or header for tests/emu/cuda_emu_device.hpp.

# Each launch `k<<<cfg>>>(args)` becomes `k | ::dp_emu::Launch{cfg}(args)`.
# Usage: cmake -DIN=x.cu -DOUT=x.cpp -P emulate_cu.cmake (or -DIN=x.cuh -DOUT=x.cuh)
file(READ "${IN}" _src)
string(FIND "${_src}" "<<<" _first)
string(FIND "${_src}" "__global__" _kernel)
if(_first EQUAL -1 AND _kernel EQUAL -1)
  message(FATAL_ERROR "emulate_cu: ${IN} has no kernel (no __global__, no <<<)")
endif()
string(REPLACE "<<<" " | ::dp_emu::Launch{" _src "${_src}")
string(REPLACE ">>>" "}" _src "${_src}")
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by tests/emu/emulate_cu.cmake: do not edit.\n#line 1 \"${IN}\"\n${_src}")
file(RENAME "${OUT}.tmp" "${OUT}")
