"""The base of our allow-list unpicklers: BUILD only onto fresh instances of plain data types.

A pickle's BUILD sets attributes (or calls `__setstate__`) on whatever object is on the stack.
Onto an allowed class itself it would rewire that class for the rest of the process
(`PosixPath.__truediv__`, say) even when the file is refused afterwards; onto a shared object
(a dtype, an enum member) likewise. The C unpickler cannot be asked before a BUILD, the
pure-Python one can: files read this way are small (DCP metadata, a `.pdparams`).
"""

import pickle


class PlainDataUnpickler(pickle._Unpickler):
    """An unpickler whose BUILD is refused unless the object is an instance of `buildable()`, and, for
    types without their own `__setstate__`, the state is a dict of plain field names."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def buildable(self) -> tuple:
        """The types whose instances a BUILD may fill (none by default)."""
        return ()

    def load_build(self):
        inst, state = self.stack[-2], self.stack[-1]
        kind = type(inst)
        if isinstance(inst, type) or not isinstance(inst, self.buildable()):
            raise pickle.UnpicklingError(f"BUILD on {getattr(inst, '__qualname__', kind.__qualname__)} refused "
                                         "(only fresh data records take a state)")
        # A type's own __setstate__ (TensorProperties', ndarray's) is known code that fills the record;
        # the default sets attributes by name, where `__class__` and the like would change the object.
        if getattr(kind, "__setstate__", None) is None:
            slots = None
            if isinstance(state, tuple) and len(state) == 2:
                state, slots = state
            for part in (state, slots):
                if part is not None and not (isinstance(part, dict) and all(
                        isinstance(k, str) and k.isidentifier() and not k.startswith("__") for k in part)):
                    raise pickle.UnpicklingError(f"BUILD of {kind.__qualname__} with state other than plain field names")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build
