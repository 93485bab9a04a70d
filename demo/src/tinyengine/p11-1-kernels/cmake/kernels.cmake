# The kernels library, pinned by tag (the tool resolves the tag to a commit and supplies the source).
set(TINYKERNELS_TAG v0.1.0)

# TINYKERNELS_SRC_DIR (env): build against a local checkout instead (like vLLM's VLLM_CUTLASS_SRC_DIR)
if(DEFINED ENV{TINYKERNELS_SRC_DIR})
  set(TINYKERNELS_SRC_DIR $ENV{TINYKERNELS_SRC_DIR})
endif()

if(TINYENGINE_TARGET_DEVICE STREQUAL "cuda")
  # device kernels exist only for CUDA targets
  FetchContent_Declare(tinykernels_cuda GIT_REPOSITORY ../tinykernels-cuda.git GIT_TAG ${TINYKERNELS_TAG})
  FetchContent_MakeAvailable(tinykernels_cuda)
endif()

if(TINYKERNELS_SRC_DIR)
  FetchContent_Declare(tinykernels SOURCE_DIR ${TINYKERNELS_SRC_DIR})
else()
  FetchContent_Declare(tinykernels
    GIT_REPOSITORY ../tinykernels.git  # relative to this repository's remote (CMP0150)
    GIT_TAG ${TINYKERNELS_TAG}
    GIT_SHALLOW TRUE)
endif()
FetchContent_MakeAvailable(tinykernels)
