# Installs the dtf build tree into a scratch prefix, then configures and builds the consumer
# project against it (find_package(dtf)), and runs its program — the README's first program —
# under `dtfrun --ps 1 --workers 2`: it must train with dtf::train and print the chief's RESULT
# line. Arguments: BUILD_DIR, WORK_DIR, SOURCE_DIR, DTF_CUDA, DTFRUN.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
set(launcher)
find_program(CCACHE ccache)
if(CCACHE)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
    -DCMAKE_BUILD_TYPE=Release ${launcher})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
if(NOT DTF_CUDA)
  execute_process(
    COMMAND ${DTFRUN} --ps 1 --workers 2 --grace_ms 20000 -- ${WORK_DIR}/build/consumer --epochs 2
            --train_examples 6000 --blas_threads 1 --log_every 50 --model_dir ${WORK_DIR}/model --target_accuracy 0.5
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the consumer program failed under dtfrun (status ${rc})")
  endif()
  if(NOT out MATCHES "RESULT scheme=readme workers=2 accuracy=0\\.[5-9]")
    message(FATAL_ERROR "no RESULT line with the accuracy from the chief")
  endif()
  if(NOT out MATCHES "ps.0: shut down by the chief")
    message(FATAL_ERROR "the ps did not end with the job")
  endif()
  if(NOT EXISTS ${WORK_DIR}/model/checkpoint)
    message(FATAL_ERROR "the chief wrote no checkpoint into --model_dir")
  endif()
endif()
