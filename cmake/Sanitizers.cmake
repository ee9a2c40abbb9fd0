# STEALBATCH_SANITIZE: 'address,undefined' or 'thread', applied to all C++ code built in this tree.
if(STEALBATCH_SANITIZE)
  if(NOT STEALBATCH_SANITIZE MATCHES "^(address,undefined|undefined,address|address|undefined|thread)$")
    message(FATAL_ERROR "STEALBATCH_SANITIZE='${STEALBATCH_SANITIZE}': use 'address,undefined' or 'thread'")
  endif()
  # -g1: line tables, all a sanitizer's report needs, at a fraction of -g's compile time (the ASan build of the suite
  # took 329 s against about 417 s).
  set(_sb_san -fsanitize=${STEALBATCH_SANITIZE} -fno-omit-frame-pointer -g1)
  if(STEALBATCH_SANITIZE MATCHES "undefined")
    list(APPEND _sb_san -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_sb_san}>")
  add_link_options(-fsanitize=${STEALBATCH_SANITIZE})
  # Sanitizer builds run smaller sizes (never weaker assertions); the tests read this definition.
  add_compile_definitions(STEALBATCH_SANITIZED=1)
endif()
