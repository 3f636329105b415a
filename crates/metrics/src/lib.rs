//! Model-server `/metrics` ingestion for vLLM, SGLang and TGI.
