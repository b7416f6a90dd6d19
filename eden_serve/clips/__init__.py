"""The clip engine: a clip's pairs streamed in chunks through any processor, in order and within a
window (:mod:`.streaming`), level by level for 4x and 8x (:mod:`.levels`) or only the middles a
retimed output shows (:mod:`.retimed`, :mod:`.schedule`), on worker threads (:mod:`.workers`,
:mod:`.dispatch`); the processors (:mod:`.processors`, :mod:`.resize`); the in-process pipeline, the
same computation as the servers' (:mod:`.pipeline`); and the command line's clip options
(:mod:`.arguments`). The client, the pipeline and the page all run clips through it."""
