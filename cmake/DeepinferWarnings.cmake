# deepinfer_set_warnings(<target>): the warning set every first-party target compiles with.
function(deepinfer_set_warnings target)
  if(MSVC)
    target_compile_options(${target} PRIVATE /W4)
    if(DEEPINFER_WERROR)
      target_compile_options(${target} PRIVATE /WX)
    endif()
  else()
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wnull-dereference
                                -Wimplicit-fallthrough>)
    # GCC 12 reports -Wrestrict false positives inside libstdc++'s std::string concatenation at
    # -O2/-O3 (GCC bug 105329, fixed in GCC 13); -Werror would turn them into build failures.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
    endif()
    if(DEEPINFER_WERROR)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
    endif()
  endif()
endfunction()
