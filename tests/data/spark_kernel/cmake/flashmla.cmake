# sparkbuild test data (our own code): a target defined in an included file, as sgl-kernel's
# cmake/flashmla.cmake defines flashmla_ops, with Hopper and Blackwell-server code only.
set(FLASHMLA_CUDA_FLAGS
    "-gencode=arch=compute_90a,code=sm_90a"
    "-gencode=arch=compute_100a,code=sm_100a"
)
Python_add_library(flashmla_ops MODULE WITH_SOABI ${SOURCES})
target_compile_options(flashmla_ops PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${FLASHMLA_CUDA_FLAGS}>)
set_target_properties(flashmla_ops PROPERTIES
    OUTPUT_NAME "_kernels" LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/flashmla"
)
install(TARGETS flashmla_ops LIBRARY DESTINATION "spark_kernel/flashmla")
