"""What the caller's side and the worker's side of remote functions agree on: the task names, the
Python check and the call's and reply's fields (``call``), a session's messages (``session``),
package lists and their environment key (``packages``), the settings section (``settings``), the
classes that take remote calls (``classes``) and the heartbeat's remote fields (``heartbeat``)."""
