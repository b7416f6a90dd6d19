"""Workflow handler of eden.war: torch-workflow-archiver requires one, but the eden DAG has no
function nodes (eden_encoder -> eden_ditdec), so it defines nothing."""
