"""The schema registry: Confluent Schema Registry's model (subjects, versions, schema ids
unique in the cluster, compatibility levels, modes) with its schemas kept in lakelog's
own compacted internal topic ``__schemas``, so that every broker of a cluster shares
them and they outlive any one broker.

``formats``: parsing and identity of Avro and JSON Schema schemas; ``compatibility``:
Confluent's levels, Avro's by Apache Avro's own checker; ``state``: the registry as the
records of ``__schemas`` make it; ``store``: where those records are written and read;
``registry``: the operations the fronts call.
"""
