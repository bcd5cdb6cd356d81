"""The Airflow plugin: the query API and the status page in Airflow's api-server."""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from statetable_airflow.api import AirflowAuth, create_app
from statetable_airflow.timetables import BackfillOnlyTimetable, NextTimeOnlyTimetable

URL_PREFIX = "/statetable"


class StatetablePlugin(AirflowPlugin):
    name = "statetable"
    timetables = [BackfillOnlyTimetable, NextTimeOnlyTimetable]
    fastapi_apps = [{"app": create_app(AirflowAuth()), "url_prefix": URL_PREFIX, "name": "statetable"}]
    external_views = [{"name": "State tables", "href": f"{URL_PREFIX}/ui", "destination": "nav",
                       "url_route": "statetable", "category": "browse"}]
