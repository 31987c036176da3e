# layering.rejects_bad_include: runs scripts/check_layers.py --root ROOT on a deliberately broken
# tree and passes only if it exits with status 1 and prints exactly the lines of EXPECTED.
#   cmake -DPYTHON=... -DSCRIPT=... -DROOT=... -DEXPECTED=... -P expect_violations.cmake
foreach(var PYTHON SCRIPT ROOT EXPECTED)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "expect_violations.cmake: -D${var}=... is required")
  endif()
endforeach()

execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --root "${ROOT}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ "${EXPECTED}" expected)
message("${out}${err}")
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "check_layers.py exited with '${rc}', expected 1 (violations found)")
endif()
if(NOT out STREQUAL expected)
  message(FATAL_ERROR "check_layers.py output differs from ${EXPECTED}; expected:\n${expected}")
endif()
if(NOT err STREQUAL "")
  message(FATAL_ERROR "check_layers.py wrote to stderr")
endif()
message("layering.rejects_bad_include: exit status 1 and the expected ${ROOT} violations")
