"""The execution side's lookup: which record and which of its tasks a loaded pipeline object is (added for the
engines, preview, prompting and networks, issue 28 item 1).

`registry.of_pipe` gives the record; `task_of` also says which task's pipeline class the object is (txt2img,
img2img, inpaint, a ControlNet one; None for a class the record claims without a task of ours, or for a family no
record knows). Both walk the object's class hierarchy, so a subclass of a claimed pipeline is its family's.
"""

from __future__ import annotations

from lowvram_gen.families.record import Family, Task
from lowvram_gen.families.records import GENERIC
from lowvram_gen.families.registry import find_pipeline


def task_of(pipe) -> tuple[Family, Task | None]:
    """(the record of a loaded pipeline, the task whose pipeline class it is or None); (GENERIC, None) where no
    record claims it."""
    for cls in type(pipe).__mro__:
        record = find_pipeline(cls.__name__)
        if record is not None:
            for task, name in record.tasks.items():
                if name == cls.__name__:
                    return record, Task(task)
            return record, None
    return GENERIC, None


def is_task(pipe, *tasks: Task) -> bool:
    """Whether `pipe` is its record's pipeline for one of `tasks`."""
    return task_of(pipe)[1] in tasks
